"""The streaming GRPO step: micro-batches of complete prompt groups are scored, checked to
be on-policy, split across the trainer's ranks and trained on as the controller releases
them; the optimizer steps once the step's batch is complete.

TrainerGroup drives the rank actors (rlboost.trainer.rank.TrainerRank) together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import ray

from rlboost.controller.staleness import staleness_histogram
from rlboost.errors import StepFailed
from rlboost.trainer.batch import MicroBatch, ScoredSample, build_micro_batch
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.rank import RankSpec, TrainerRank
from rlboost.trainer.split import split_for_ranks


class TrainerGroup:
    """N rank actors; each method calls every rank at once and waits for all.

    max_tokens: each forward's token budget per rank (None: a rank's whole share at once);
    packed: forwards hold samples end to end without padding (trainer.split)."""

    def __init__(self, ranks: Sequence[Any], *, max_tokens: int | None = None, packed: bool = False):
        self.ranks = list(ranks)
        self.max_tokens, self.packed = max_tokens, packed
        self._pending: list[Any] = []
        self.publisher_address: str | None = None

    @classmethod
    def launch(cls, specs: Sequence[RankSpec], actor_options: dict[str, Any]) -> TrainerGroup:
        """Create the rank actors (in parallel; nothing joins the process group yet)."""
        actor = ray.remote(TrainerRank).options(**actor_options)
        return cls([actor.remote(spec) for spec in specs], max_tokens=specs[0].max_tokens_per_micro_batch,
                   packed=specs[0].packing)

    def setup(self, init_method: str | None = None, optimizer_state: str | None = None) -> int:
        """Every rank joins the process group (init_method: e.g. "file:///shared/rdzv"; None:
        TCP at rank 0's host) and loads its shard; returns the parameter count."""
        init_method = init_method or ray.get(self.ranks[0].endpoint.remote())
        counts = ray.get([r.setup.remote(init_method, optimizer_state) for r in self.ranks])
        self.publisher_address = ray.get(self.ranks[0].address.remote())
        return counts[0]

    def accumulate(self, batch: MicroBatch) -> None:
        """Hand each rank its forwards of the micro-batch; returns at once (ranks run in order)."""
        shares = split_for_ranks(batch, len(self.ranks), max_tokens=self.max_tokens, packed=self.packed)
        for rank, forwards in zip(self.ranks, shares):
            self._pending.extend(rank.accumulate.remote(part) for part in forwards)

    def wait(self) -> None:
        """Wait until every rank has trained on the micro-batches handed to it."""
        pending, self._pending = self._pending, []
        ray.get(pending)

    def finish_step(self, denominator: float) -> dict:
        """Wait for the step's micro-batches, then step the optimizer on every rank."""
        self.wait()
        per_rank = ray.get([r.finish_step.remote(float(denominator)) for r in self.ranks])
        tokens = sum(r["tokens"] for r in per_rank)
        weighted = sum(r.get("decoupled_tokens", 0) for r in per_rank)
        extra = {} if not weighted else {  # bounded staleness: behaviour importance weights
            "is_weight_mean": sum(r["is_weight_sum"] for r in per_rank) / weighted,
            "is_truncated_share": sum(r["is_truncated_tokens"] for r in per_rank) / weighted}
        return {**extra, "loss": sum(r["loss_sum"] for r in per_rank) / denominator,
                "kl": sum(r["kl_sum"] for r in per_rank) / denominator,
                "clip_fraction": sum(r["clipped_tokens"] for r in per_rank) / max(tokens, 1),
                "mean_ratio": sum(r["ratio_sum"] for r in per_rank) / max(tokens, 1),
                "grad_norm": per_rank[0]["grad_norm"],
                **({"lr": per_rank[0]["lr"]} if "lr" in per_rank[0] else {}),
                "rank_busy_s": max(r["train_s"] for r in per_rank)}

    def publish(self, version: int) -> dict:
        return ray.get([r.publish.remote(version) for r in self.ranks])[0]

    def save_checkpoint(self, directory: str, tokenizer_dir: str | None) -> None:
        ray.get([r.save_checkpoint.remote(directory, tokenizer_dir) for r in self.ranks])

    def close(self, timeout_s: float = 60.0) -> None:
        """Leave the process group cleanly where possible; kill whatever does not answer."""
        try:
            ray.get([r.close.remote() for r in self.ranks], timeout=timeout_s)
        except Exception:  # a rank already died or hangs: the group is being torn down anyway
            pass
        for r in self.ranks:
            ray.kill(r)


def split_rows(batch: MicroBatch, parts: int) -> list[MicroBatch]:
    """Deal the rows over `parts` ranks, longest first, so each gets a similar token count;
    each share is trimmed to its own longest row. A rank left without rows gets a row with
    no response token (its loss is 0), because every rank must run the same collectives."""
    return [forwards[0] for forwards in split_for_ranks(batch, parts)]


@dataclass(slots=True)
class StepOutcome:
    """What the trainer saw in one step."""

    samples: int = 0
    unique_samples: int = 0
    versions: set = field(default_factory=set)  # weight versions the trained samples came from
    example: ScoredSample | None = None  # the step's first sample, for the metrics log
    rewards: list[float] = field(default_factory=list)
    response_lengths: list[int] = field(default_factory=list)  # output tokens of each trained sample
    sampled_nll: float = 0.0  # sum of -log p of the sampled tokens, as the engines scored them
    denominator: int = 0
    microbatches: int = 0
    wait_s: float = 0.0
    busy_s: float = 0.0
    train: dict = field(default_factory=dict)
    staleness: tuple = ()  # bounded staleness: output tokens trained at lag 0, 1, .., max_staleness

    def add_staleness(self, version: int, max_staleness: int, scored: Sequence[ScoredSample]) -> None:
        hist = staleness_histogram(version, max_staleness, [(s.changes, len(s.output_ids)) for s in scored])
        self.staleness = tuple(a + b for a, b in zip(self.staleness, hist)) if self.staleness else hist

    @property
    def reward_mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else float("nan")


def train_streaming(trainer: TrainerGroup, next_microbatch: Callable[[float], Any],
                    score: Callable[[Any], list[ScoredSample]], *, version: int, group_size: int,
                    pad_id: int, grpo: GRPOConfig, timeout_s: float, poll_s: float = 1.0,
                    max_staleness: int = 0, on_last: Callable[[], None] | None = None) -> StepOutcome:
    """Train on the step's micro-batches as they arrive, then step the optimizer.

    next_microbatch(timeout) returns the controller's next MicroBatch or None. Strictly
    on-policy by default: a sample from any other weight version raises StaleSampleError;
    with max_staleness N >= 1 every token must come from versions version-N .. version
    (bounded staleness, trained with the decoupled objective). on_last is called once the
    step's last micro-batch is handed to the ranks, before they finish training on it (the
    driver starts the next step's rollout there). Raises StepFailed when nothing arrives
    for timeout_s.
    """
    out, seen = StepOutcome(), set()
    idle_since = time.perf_counter()
    while True:
        # ask for the next micro-batch only once the ranks are free: the controller counts the
        # wait as the trainer's idle time, which sizes the next step's local window
        trainer.wait()
        t0 = time.perf_counter()
        mb = next_microbatch(poll_s)
        out.wait_s += time.perf_counter() - t0
        if mb is None:
            if time.perf_counter() - idle_since > timeout_s:
                raise StepFailed(f"no micro-batch arrived for {time.perf_counter() - idle_since:.0f} s "
                                 f"(run.microbatch_timeout_s={timeout_s})", missing=())
            continue
        idle_since = t1 = time.perf_counter()
        if mb.groups:
            scored = score(mb)
            batch = build_micro_batch(scored, pad_id=pad_id, config=grpo, expected_group_size=group_size,
                                      weight_version=version, max_staleness=max_staleness)
            trainer.accumulate(batch)
            if max_staleness:
                out.add_staleness(version, max_staleness, scored)
            out.samples += len(scored)
            seen.update(s.sample_id for s in scored)
            out.versions.update(s.weight_version for s in scored)
            out.example = out.example or scored[0]
            out.rewards.extend(s.reward for s in scored)
            out.response_lengths.extend(len(s.output_ids) for s in scored)
            out.sampled_nll -= sum(sum(s.output_logprobs) for s in scored)
            out.denominator += batch.denominator(grpo.aggregation)
            out.microbatches += 1
        out.busy_s += time.perf_counter() - t1
        if mb.last:
            if on_last is not None:
                on_last()
            break
    out.unique_samples = len(seen)
    if out.denominator == 0:
        raise StepFailed("the step's batch holds no response token", missing=())
    t2 = time.perf_counter()
    out.train = trainer.finish_step(out.denominator)
    out.busy_s += time.perf_counter() - t2
    return out
