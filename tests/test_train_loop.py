"""The streaming step: micro-batches are scored, checked to be on-policy, dealt over the
ranks, and the step's loss is normalised by all of its response tokens; the task feed
hands out deterministic prompt groups and rewards finished samples."""

from __future__ import annotations

import pytest
import torch

from rlboost.controller.records import CompletedGroup, CompletedSample, MicroBatch
from rlboost.errors import StaleSampleError, StepFailed
from rlboost.migration.state import SamplingParams
from rlboost.models import ByteTokenizer, empty_model, tiny_config
from rlboost.models.checkpoint import init_random
from rlboost.tasks.arithmetic import ArithmeticTask
from rlboost.trainer.batch import ScoredSample, build_micro_batch, micro_batch_loss
from rlboost.trainer.feed import TaskFeed
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.loop import split_rows, train_streaming

TOK = ByteTokenizer()
GROUP = 4


def _samples(n_groups: int, version: int = 3) -> list[ScoredSample]:
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(n_groups * GROUP):
        n_out = 1 + i % 5
        out.append(ScoredSample(
            sample_id=i, group_id=i // GROUP, prompt_ids=tuple(torch.randint(0, 256, (2 + i % 3,), generator=g).tolist()),
            output_ids=tuple(torch.randint(0, 256, (n_out,), generator=g).tolist()),
            output_logprobs=tuple((-1.0 - 0.1 * i,) * n_out), reward=float(i % 3 == 0), weight_version=version))
    return out


class FakeTrainerGroupForTests:
    """Records the shares each rank gets and the denominator of the optimizer step."""

    def __init__(self, ranks: int):
        self.shares = [[] for _ in range(ranks)]
        self.denominators = []

    def accumulate(self, batch):
        for k, part in enumerate(split_rows(batch, len(self.shares))):
            self.shares[k].append(part)

    def wait(self):  # shares are recorded as they are handed out: nothing is ever pending
        pass

    def finish_step(self, denominator):
        self.denominators.append(denominator)
        return {"loss": 0.0}


def test_rows_are_dealt_evenly_and_each_share_trimmed():
    batch = build_micro_batch(_samples(3), pad_id=TOK.pad_id)
    parts = split_rows(batch, 2)
    ids = sorted(i for p in parts for i in p.sample_ids)
    assert ids == sorted(batch.sample_ids)
    tokens = [int(p.attention_mask.sum()) for p in parts]
    assert abs(tokens[0] - tokens[1]) <= max(int(batch.attention_mask.sum(1).max()), 1)
    for p in parts:
        assert p.input_ids.shape[1] == int(p.attention_mask.sum(1).max())
        assert p.num_response_tokens == sum(len(s.output_ids) for s in _samples(3) if s.sample_id in p.sample_ids)


def test_a_rank_without_rows_gets_a_share_with_no_response_token():
    batch = build_micro_batch(_samples(1)[:1] + _samples(1)[1:2], pad_id=TOK.pad_id)
    parts = split_rows(batch, 3)
    assert [p.num_sequences for p in parts] == [1, 1, 1]
    assert parts[2].num_response_tokens == 0 and parts[2].sample_ids == ()
    model = init_random(empty_model(tiny_config("qwen3", vocab_size=TOK.vocab_size)), seed=0)
    loss = micro_batch_loss(model, parts[2], GRPOConfig(), denominator=1.0).loss
    loss.backward()
    assert loss.item() == 0.0
    assert all(float(p.grad.abs().sum()) == 0.0 for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_summed_shares_over_the_step_denominator_equal_the_full_batch_loss(aggregation):
    """What the ranks compute (per-share sums, gradients summed, divided by the step's
    denominator at the end) equals the loss and gradient of the whole step at once."""
    cfg = GRPOConfig(aggregation=aggregation)
    model = init_random(empty_model(tiny_config("qwen3", vocab_size=TOK.vocab_size)), seed=1)
    samples = _samples(4)
    whole = build_micro_batch(samples, pad_id=TOK.pad_id, config=cfg)
    ref = micro_batch_loss(model, whole, cfg).loss
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    denominator, total = 0, 0.0
    for half in (samples[:8], samples[8:]):  # two micro-batches of whole groups ...
        mb = build_micro_batch(half, pad_id=TOK.pad_id, config=cfg)
        denominator += mb.denominator(aggregation)
        for part in split_rows(mb, 3):  # ... each dealt over three ranks
            loss = micro_batch_loss(model, part, cfg, denominator=1.0).loss
            loss.backward()
            total += loss.item()
    assert total / denominator == pytest.approx(ref.item(), rel=1e-5, abs=1e-7)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad / denominator, ref_grads[n], rtol=1e-4, atol=1e-6)


def _microbatches(samples: list[ScoredSample], per_batch: int):
    groups = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    completed = [CompletedGroup(group_id=g, prompt_ids=members[0].prompt_ids, samples=tuple(
        CompletedSample(sample_id=s.sample_id, output_ids=s.output_ids, output_logprobs=s.output_logprobs,
                        finish_reason="stop", weight_version=s.weight_version) for s in members))
        for g, members in groups.items()]
    chunks = [completed[i:i + per_batch] for i in range(0, len(completed), per_batch)]
    return [MicroBatch(step=1, groups=tuple(c), last=i == len(chunks) - 1) for i, c in enumerate(chunks)]


def _scorer(samples: list[ScoredSample]):
    by_id = {s.sample_id: s for s in samples}
    return lambda mb: [by_id[s.sample_id] for g in mb.groups for s in g.samples]


def test_streaming_step_trains_every_sample_once_and_steps_on_all_tokens():
    samples = _samples(5)
    source = iter([None, *_microbatches(samples, 2)])  # None: nothing ready yet
    trainer = FakeTrainerGroupForTests(2)
    out = train_streaming(trainer, lambda timeout: next(source), _scorer(samples), version=3,
                          group_size=GROUP, pad_id=TOK.pad_id, grpo=GRPOConfig(), timeout_s=60)
    assert out.samples == out.unique_samples == len(samples) and out.versions == {3}
    assert out.microbatches == 3 and len(trainer.shares[0]) == len(trainer.shares[1]) == 3
    trained = sorted(i for shares in trainer.shares for p in shares for i in p.sample_ids)
    assert trained == [s.sample_id for s in samples]
    assert trainer.denominators == [sum(len(s.output_ids) for s in samples)]
    assert out.reward_mean == pytest.approx(sum(s.reward for s in samples) / len(samples))


def test_a_step_reports_response_lengths_and_the_sampled_tokens_entropy_estimate():
    from rlboost.run.metrics import _responses

    samples = _samples(3)
    source = iter(_microbatches(samples, 3))
    out = train_streaming(FakeTrainerGroupForTests(1), lambda timeout: next(source), _scorer(samples), version=3,
                          group_size=GROUP, pad_id=TOK.pad_id, grpo=GRPOConfig(), timeout_s=60)
    lengths = [len(s.output_ids) for s in samples]
    got = _responses(out)
    assert got["response_length_mean"] == pytest.approx(sum(lengths) / len(lengths))
    assert got["response_length_max"] == max(lengths)
    nll = -sum(sum(s.output_logprobs) for s in samples)
    assert got["entropy"] == pytest.approx(nll / sum(lengths)) and got["entropy"] > 1.0


def test_a_sample_from_another_weight_version_is_refused():
    samples = _samples(2)
    samples[5] = ScoredSample(**{**{f: getattr(samples[5], f) for f in ScoredSample.__slots__},
                                 "weight_version": 2})
    source = iter(_microbatches(samples, 2))
    with pytest.raises(StaleSampleError, match="version 3"):
        train_streaming(FakeTrainerGroupForTests(2), lambda timeout: next(source), _scorer(samples),
                        version=3, group_size=GROUP, pad_id=TOK.pad_id, grpo=GRPOConfig(), timeout_s=60)


def test_bounded_staleness_trains_older_versions_tokens_and_starts_the_next_step_before_the_update():
    samples = [ScoredSample(**{**{f: getattr(s, f) for f in ScoredSample.__slots__}, "weight_version": 2})
               if s.group_id % 2 else s for s in _samples(4)]
    source = iter(_microbatches(samples, 2))
    trainer, events = FakeTrainerGroupForTests(2), []
    finish = trainer.finish_step
    trainer.finish_step = lambda d: events.append("finish_step") or finish(d)
    out = train_streaming(trainer, lambda timeout: next(source), _scorer(samples), version=3, group_size=GROUP,
                          pad_id=TOK.pad_id, grpo=GRPOConfig(), timeout_s=60, max_staleness=1,
                          on_last=lambda: events.append("next step starts"))
    assert events == ["next step starts", "finish_step"]
    assert out.versions == {2, 3} and all(p.decoupled for shares in trainer.shares for p in shares)
    lag = lambda v: sum(len(s.output_ids) for s in samples if s.weight_version == v)  # noqa: E731
    assert out.staleness == (lag(3), lag(2))
    source = iter(_microbatches(samples, 2))
    with pytest.raises(StaleSampleError, match="accepts 3..4"):  # version 2 is two behind step 4
        train_streaming(FakeTrainerGroupForTests(2), lambda timeout: next(source), _scorer(samples), version=4,
                        group_size=GROUP, pad_id=TOK.pad_id, grpo=GRPOConfig(), timeout_s=60, max_staleness=1)


def test_a_step_with_nothing_arriving_fails_after_its_timeout():
    with pytest.raises(StepFailed, match="no micro-batch"):
        train_streaming(FakeTrainerGroupForTests(1), lambda timeout: None, lambda mb: [], version=1,
                        group_size=GROUP, pad_id=TOK.pad_id, grpo=GRPOConfig(), timeout_s=0.0)


def _feed(**kw) -> TaskFeed:
    return TaskFeed(ArithmeticTask(), TOK, groups_per_step=3, group_size=GROUP,
                    params=SamplingParams(max_new_tokens=4, stop_token_ids=(TOK.eos_id,)), **kw)


def test_feed_groups_are_deterministic_per_step_and_distinct_across_steps():
    a, b = _feed(), _feed()
    assert a.groups(4) == b.groups(4)
    assert [g.group_id for g in a.groups(4)] == [400000, 400001, 400002]
    assert [g.prompt_ids for g in a.groups(4)] != [g.prompt_ids for g in a.groups(5)]
    assert all(g.prompt_ids[0] == TOK.bos_id for g in a.groups(4))  # as in the warm-up


def test_feed_rewards_only_answers_that_stopped():
    feed = _feed()
    group = feed.groups(1)[0]
    problem = feed._problems[group.group_id]
    right = tuple(TOK.encode(problem.answer)) + (TOK.eos_id,)
    assert feed.reward(problem, right, "stop") == 1.0
    assert feed.reward(problem, right[:-1], "length") == 0.0
    assert feed.reward(problem, tuple(TOK.encode("x")) + (TOK.eos_id,), "stop") == 0.0
    chatty = _feed(extract_answer=True)
    group = chatty.groups(1)[0]
    problem = chatty._problems[group.group_id]
    said = tuple(TOK.encode(f"{problem.prompt} {problem.answer}")) + (TOK.eos_id,)
    assert chatty.reward(problem, said, "stop") == 1.0


def test_feed_refuses_groups_it_did_not_hand_out():
    feed = _feed()
    feed.groups(1)
    stranger = CompletedGroup(group_id=999, prompt_ids=(1,), samples=())
    with pytest.raises(ValueError, match="999"):
        feed.score_group(stranger)


def test_feed_scores_a_step_after_later_steps_were_drawn():
    # with bounded staleness the driver draws the next steps' groups while a step is scored
    feed = _feed()
    group = feed.groups(1)[0]
    feed.groups(2), feed.groups(3)
    done = CompletedGroup(group_id=group.group_id, prompt_ids=group.prompt_ids, samples=tuple(
        CompletedSample(sample_id=sid, output_ids=(5, TOK.eos_id), output_logprobs=(-0.5, -0.25),
                        finish_reason="stop", weight_version=1) for sid in group.sample_ids))
    assert len(feed.score_group(done)) == GROUP
    feed.groups(1 + 20)  # steps far behind the newest drawn are forgotten
    with pytest.raises(ValueError, match=str(group.group_id)):
        feed.score_group(done)


def test_chat_template_needs_a_chat_tokenizer():
    with pytest.raises(ValueError, match="chat"):
        _feed(chat_template=True)


def test_scored_samples_and_rank_shares_carry_the_sampling_temperature():
    # Engines report log-probs under softmax(logits / T); the trainer must score at the same
    # T or the on-policy ratio drifts from 1 (at T=0.6 by ~12%, clipping a fifth of tokens).
    feed = TaskFeed(ArithmeticTask(), TOK, groups_per_step=2, group_size=GROUP,
                    params=SamplingParams(temperature=0.6, max_new_tokens=4, stop_token_ids=(TOK.eos_id,)))
    group = feed.groups(1)[0]
    done = CompletedGroup(group_id=group.group_id, prompt_ids=group.prompt_ids, samples=tuple(
        CompletedSample(sample_id=group.group_id * 65536 + j, output_ids=(5, TOK.eos_id),
                        output_logprobs=(-0.5, -0.25), finish_reason="stop", weight_version=1)
        for j in range(GROUP)))
    scored = feed.score_group(done)
    assert {s.temperature for s in scored} == {0.6}
    batch = build_micro_batch(scored, pad_id=TOK.pad_id, weight_version=1)
    assert [part.temperature for part in split_rows(batch, 3)] == [0.6, 0.6, 0.6]
