"""How a step's samples are laid out on 2 FSDP2 ranks changes neither its loss nor a single
gradient: a token-budget split equals one big micro-batch per rank, packed sequences equal
padded ones, activation checkpointing equals keeping every activation, and optimizer state
offloaded to the host equals state kept with the parameters. Both loss aggregations, a
Qwen3 (tied head, q/k norms) and a Llama checkpoint, log-probs computed in small chunks.

Tolerance: float32 with different reduction orders, within 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.trainer import fsdp
from rlboost.trainer.batch import ScoredSample, build_micro_batch, micro_batch_loss
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.split import split_for_ranks

WORLD = 2
VOCAB = 263
CHUNK = 4 * VOCAB * 3  # three positions per log-prob chunk
# name -> (max_tokens_per_micro_batch, packed, activation_checkpointing, offload)
MODES = {"whole": (None, False, False, False), "budget": (40, False, False, False),
         "packed": (None, True, False, False), "packed_budget": (40, True, False, False),
         "checkpointed": (None, True, True, False), "offload": (40, True, False, True)}
CASES = [("qwen3", "token_mean"), ("llama", "seq_mean")]


def _samples() -> list[ScoredSample]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(12):  # 3 groups of 4, lengths 5 to 19 tokens
        n_prompt, n_out = 3 + i % 4, 2 + (5 * i) % 11
        out.append(ScoredSample(
            sample_id=i, group_id=i // 4,
            prompt_ids=tuple(torch.randint(1, VOCAB, (n_prompt,), generator=g).tolist()),
            output_ids=tuple(torch.randint(1, VOCAB, (n_out,), generator=g).tolist()),
            output_logprobs=tuple((-5.0 - 0.1 * i,) * n_out), reward=float((i * 7) % 5)))
    return out


def _step(rank, mesh, checkpoint, grpo, mode) -> dict:
    max_tokens, packed, checkpointing, offload = mode
    model = load_pretrained(checkpoint)
    model.activation_checkpointing = checkpointing
    model = fsdp.shard_model(model, mesh, fsdp.FSDPConfig(), offload=offload)
    batch = build_micro_batch(_samples(), pad_id=0, config=grpo)
    forwards = split_for_ranks(batch, WORLD, max_tokens=max_tokens, packed=packed)[rank]
    total = torch.zeros(())
    for part in forwards:
        out = micro_batch_loss(model, part, grpo, denominator=1.0, chunk_bytes=CHUNK)
        out.loss.backward()
        total += out.loss.detach()
    torch.distributed.all_reduce(total)
    denominator = batch.denominator(grpo.aggregation)
    grads = {n: p.grad.full_tensor().cpu() / denominator for n, p in model.named_parameters()}
    return {"loss": float(total) / denominator, "grads": grads, "forwards": len(forwards),
            "grad_device": {str(p.grad.device) for p in model.parameters()}}


def _worker(rank, rendezvous, checkpoints, out_dir) -> None:
    torch.set_num_threads(1)
    mesh = fsdp.init_distributed(rank, WORLD, timeout_s=120, init_method=rendezvous)
    try:
        results = {}
        for arch, aggregation in CASES:
            grpo = GRPOConfig(aggregation=aggregation)
            for name, mode in MODES.items():
                results[(arch, name)] = _step(rank, mesh, checkpoints[arch], grpo, mode)
        if rank == 0:
            torch.save(results, f"{out_dir}/results.pt")
    except BaseException:
        fsdp.destroy_distributed(barrier=False)
        raise
    fsdp.destroy_distributed()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact")
    checkpoints = {arch: str(build_tiny_checkpoint(root / arch, arch=arch, seed=2, vocab_size=VOCAB, hidden_size=32,
                                                   intermediate_size=64, num_layers=2)) for arch, _ in CASES}
    mp.spawn(_worker, args=(f"file://{root / 'rendezvous'}", checkpoints, str(root)), nprocs=WORLD, join=True)
    return torch.load(root / "results.pt")


def _same(got: dict, want: dict) -> None:
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-5)
    assert got["grads"].keys() == want["grads"].keys()
    for name, grad in want["grads"].items():
        assert grad.abs().sum() > 0, f"{name} got no gradient"
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("arch", [a for a, _ in CASES])
def test_a_token_budget_split_equals_one_big_micro_batch(results, arch):
    assert results[(arch, "whole")]["forwards"] == 1
    assert results[(arch, "budget")]["forwards"] > 1
    _same(results[(arch, "budget")], results[(arch, "whole")])


@pytest.mark.parametrize("arch", [a for a, _ in CASES])
def test_packed_sequences_equal_padded_ones(results, arch):
    _same(results[(arch, "packed")], results[(arch, "whole")])
    assert results[(arch, "packed_budget")]["forwards"] > 1
    _same(results[(arch, "packed_budget")], results[(arch, "whole")])


@pytest.mark.parametrize("arch", [a for a, _ in CASES])
def test_activation_checkpointing_equals_keeping_every_activation(results, arch):
    _same(results[(arch, "checkpointed")], results[(arch, "packed")])


@pytest.mark.parametrize("arch", [a for a, _ in CASES])
def test_optimizer_offload_gives_the_same_gradients(results, arch):
    _same(results[(arch, "offload")], results[(arch, "whole")])
    assert results[(arch, "offload")]["grad_device"] == {"cpu"}
