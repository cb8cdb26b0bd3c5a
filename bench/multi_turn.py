"""Multi-turn, tool-using rollouts on preemptible capacity, in the emulated fleet at the
RLBoost artifact's proportions (recipes/paper_qwen3_8b: Qwen3-8B engines on H100s as
rlboost.timing models them, one reserved 8x H100 node as four TP-2 engines, preemptible TP-2
instances at a quarter of a spot node's price; the artifact's 128 prompts x 8 samples with
--groups 128, 32 x 8 by default to keep the run short).

Every sample is an episode of 4 model turns: each of the first three ends with a tool call,
whose answer takes 0.5-5 s (modelled; drawn per sample and turn) and comes back as an
observation of 128 tokens. The controller, its episode driver, the router, migrations and
the engines' token streams are rlboost's own code on virtual time; the tool is emulated (it
waits its latency on the controller's clock and answers with fixed tokens), the engines and
the trainer take the timing model's time. Three runs over the same prompts and seeds:

- reserved only: the four reserved engines;
- rlboost: plus four preemptible instances, preempted on a schedule (alternately a notice
  and a sudden death, each replaced after --replace-s); a preempted episode resumes from its
  last token, its tool results kept;
- restart: the same schedule, but a preempted episode starts again from its prompt and its
  tools run again (controller.migration=recompute: what a system without migration does).

Figures: tokens/s and tokens per dollar of each run (the reserved node billed throughout,
each preemptible instance while it is up); per preemption, the episode time lost: tokens
generated again (at one sample's decode rate), re-prefill (at the engine's prefill rate) and
tool calls run again (their latency). The ceiling is rlboost's run with no time lost to
preemptions (its tokens over its time less the time it lost). Fidelity: emulated.

    python bench/multi_turn.py            # table, then one JSON line
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import sys
import time
from collections import Counter

from rlboost.controller.clock import run_virtual
from rlboost.controller.service import RolloutService
from rlboost.environments.turns import TurnAnswer
from rlboost.recipes.paper_qwen3_8b import (
    ENGINE_GPUS,
    NODE_GPUS,
    ON_DEMAND_NODE_USD_H,
    SPOT_NODE_USD_H,
    TIME_SCALE,
    TOKEN_BLOCK,
    paper_controller,
    paper_engine,
)
from rlboost.rollout.emulated.lengths import LengthConfig
from rlboost.sim import EmulatedFleet, EmulatedTrainerConfig, FleetEvent, SimInstance, make_groups, run_emulated_steps
from rlboost.timing import gpu_timing
from rlboost.trainer.emulated import TrainerTiming

TURNS = 4
OBSERVATION_TOKENS = 128  # real tokens of one tool answer
EPISODE_TOKENS = 56  # emulated tokens of a typical episode, for the trainer's time per token


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--turn-tokens", type=float, default=750.0, help="mean model tokens of one turn (real tokens)")
    p.add_argument("--tool-s", default="0.5,5.0", help="tool latency range, modelled seconds")
    p.add_argument("--spot", type=int, default=4, help="preemptible instances")
    p.add_argument("--preempt-every-s", type=float, default=60.0, help="modelled seconds between preemptions")
    p.add_argument("--replace-s", type=float, default=60.0, help="modelled seconds until a preempted one is replaced")
    p.add_argument("--grace-s", type=float, default=30.0, help="a notice's grace period, modelled seconds")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.steps < 2:
        p.error(f"--steps must be at least 2 (the first step is a warm-up and not counted), got {args.steps}")
    if min(args.groups, args.group_size, args.spot) < 1:
        p.error("--groups, --group-size and --spot must be at least 1")
    return args


def run_s(modelled_s: float) -> float:
    return modelled_s / TIME_SCALE


class EmulatedToolHost:
    """Answers each turn as the episode driver asks (rlboost.environments.turns.EpisodeHost's
    answer/close), after the tool's latency on the controller's clock. It keeps no record: a
    turn asked again is run again, as by an episode that restarts; calls counts each turn's
    executions and busy_s their latency."""

    def __init__(self, clock, latency: tuple[float, float]):
        self.clock, self.latency = clock, latency
        self.calls: Counter[tuple[int, int]] = Counter()
        self.busy_s = 0.0

    def latency_of(self, sample_id: int, turn: int) -> float:
        u = int.from_bytes(hashlib.blake2b(f"{sample_id}/{turn}".encode(), digest_size=8).digest(), "little") / 2**64
        lo, hi = self.latency
        return run_s(lo + (hi - lo) * u)

    async def answer(self, sample_id: int, turn: int, token_ids, finish_reason: str) -> TurnAnswer:
        wait = self.latency_of(sample_id, turn) if turn < TURNS - 1 else 0.0
        self.calls[(sample_id, turn)] += 1
        self.busy_s += wait
        await self.clock.asleep(wait)
        if turn >= TURNS - 1:
            return TurnAnswer(sample_id=sample_id, turn=turn, observation_ids=(), done=True, replayed=False)
        ids = (7,) * max(1, OBSERVATION_TOKENS // TOKEN_BLOCK)
        return TurnAnswer(sample_id=sample_id, turn=turn, observation_ids=ids, done=False, replayed=False)

    async def close(self, sample_id: int) -> None:
        return None


def engine(args):
    # a turn ends at the engine's end token, one chance in turn_tokens per real token
    return dataclasses.replace(paper_engine(), lengths=LengthConfig(kind="geometric"),
                               stop_probability=min(1.0, TOKEN_BLOCK / args.turn_tokens))


def schedule(args, spot: int, horizon_s: float) -> list[FleetEvent]:
    """Preemptions every preempt_every_s (notice, then sudden death, alternately), each
    instance replaced replace_s later, over horizon_s of the run's clock."""
    events, serial, live = [], spot, [f"spot-{i}" for i in range(spot)]
    at, k = run_s(args.preempt_every_s), 0
    while spot and at < horizon_s:
        victim = live.pop(0)
        kind = "notice" if k % 2 == 0 else "death"
        events.append(FleetEvent(at_s=at, kind=kind, instance_id=victim, grace_s=run_s(args.grace_s)))
        name = f"spot-{serial}"
        serial += 1
        spec = SimInstance(instance_id=name, engine=engine(args), pull_s=run_s(20.0))
        events.append(FleetEvent(at_s=at + run_s(args.replace_s), kind="join", instance_id=name, spec=spec))
        live.append(name)
        at, k = at + run_s(args.preempt_every_s), k + 1
    return events


def run(args, *, spot: int, migration: str = "continue") -> dict:
    controller = dataclasses.replace(paper_controller(), migration=migration, idle_timeout_s=600.0)
    lo, hi = (float(x) for x in args.tool_s.split(","))
    out: dict = {}

    async def main(clock):
        svc = RolloutService(controller, clock=clock)
        host = EmulatedToolHost(clock, (lo, hi))
        svc.attach_environments(host)
        await svc.start()
        fleet = EmulatedFleet(svc, clock)
        for i in range(NODE_GPUS // ENGINE_GPUS):
            fleet.spawn(SimInstance(instance_id=f"reserved-{i}", kind="reserved", pull_s=0.0, engine=engine(args)))
        for i in range(spot):
            fleet.spawn(SimInstance(instance_id=f"spot-{i}", engine=engine(args), pull_s=run_s(20.0)))
        events = schedule(args, spot, horizon_s=1e6)
        fleet.schedule(events)
        # the 8-GPU trainer's time per token of a typical episode (prompt + 4 turns + 3 observations)
        per_token = TrainerTiming(engine(args), NODE_GPUS).microbatch_s([EPISODE_TOKENS]) / EPISODE_TOKENS
        trainer = EmulatedTrainerConfig(train_s_per_token=per_token, switch_s=run_s(5.0), wait_s=600.0)
        groups = lambda s: make_groups(s, num_groups=args.groups, group_size=args.group_size,  # noqa: E731
                                       prompt_len=5, max_new_tokens=14_336 // TOKEN_BLOCK, seed=args.seed)
        t0 = clock.now()
        metrics = await run_emulated_steps(svc, clock, trainer, groups, args.steps)
        out["wall_s"] = clock.now() - t0
        out["metrics"] = metrics
        out["host"] = host
        out["spot_s"] = spot_seconds(spot, events, out["wall_s"])
        await fleet.close()
        await svc.close()
    run_virtual(main)
    return out


def spot_seconds(spot: int, events: list[FleetEvent], end_s: float) -> float:
    """Preemptible instance-seconds billed: each from its start (or join) to its preemption or the end."""
    start = {f"spot-{i}": 0.0 for i in range(spot)}
    total = 0.0
    for e in events:
        if e.at_s >= end_s:
            continue
        if e.kind == "join":
            start[e.instance_id] = e.at_s
        elif e.instance_id in start:
            total += min(end_s, e.at_s + (e.grace_s if e.kind == "notice" else 0.0)) - start.pop(e.instance_id)
    return total + sum(end_s - s for s in start.values())


def lost_s(args, res: dict) -> tuple[float, int]:
    """Episode seconds lost to preemptions (modelled) and the preemptions that met the run."""
    timing = gpu_timing("qwen3-8b", "h100-sxm", ENGINE_GPUS)
    sample_tps = 1.0 / timing.decode_step_s(64, 64 * 2_000.0)  # one sample in a busy engine, real tokens/s
    prefill_tps = 4_096 / timing.prefill_s(4_096)
    m = res["metrics"]
    regenerated = sum(x.trimmed_tokens for x in m) * TOKEN_BLOCK
    reprefill = sum(x.reprefill_tokens for x in m) * TOKEN_BLOCK
    host = res["host"]
    again = sum(host.latency_of(s, t) * TIME_SCALE * (n - 1) for (s, t), n in host.calls.items() if n > 1
                and t < TURNS - 1)
    preemptions = sum(x.preemptions + x.deaths for x in m)
    return regenerated / sample_tps + reprefill / prefill_tps + again, preemptions


def figures(args, name: str, res: dict, spot: int) -> dict:
    m = res["metrics"][1:]  # the first step fills the pipeline
    tokens = sum(x.total_tokens for x in m) * TOKEN_BLOCK
    wall = sum(x.step_time_s for x in m) * TIME_SCALE
    share = wall / (res["wall_s"] * TIME_SCALE)
    dollars = (wall * ON_DEMAND_NODE_USD_H + res["spot_s"] * share * TIME_SCALE * SPOT_NODE_USD_H * ENGINE_GPUS
               / NODE_GPUS) / 3600.0
    lost, preemptions = lost_s(args, res)
    repeats = sum(n - 1 for n in res["host"].calls.values())
    return {"run": name, "tokens_per_s": tokens / wall, "tokens_per_usd": tokens / dollars,
            "lost_s_per_preemption": lost / preemptions if preemptions else 0.0, "preemptions": preemptions,
            "tool_reruns": repeats, "step_s": statistics.mean(x.step_time_s for x in m) * TIME_SCALE,
            "lost_s": lost, "wall_s": wall, "usd": dollars, "spot_s": res["spot_s"] * share * TIME_SCALE}


def ceiling_tokens_per_usd(base: dict, ours: dict) -> float:
    per_engine = base["tokens_per_s"] / (NODE_GPUS // ENGINE_GPUS)
    tokens = per_engine * ((NODE_GPUS // ENGINE_GPUS) * ours["wall_s"] + ours["spot_s"])
    return tokens / ours["usd"]


def main() -> int:
    args = parse()
    t0 = time.perf_counter()
    rows = []
    for name, spot, migration in (("reserved only", 0, "continue"),
                                  ("rlboost (resume from last token)", args.spot, "continue"),
                                  ("restart the episode", args.spot, "recompute")):
        rows.append(figures(args, name, run(args, spot=spot, migration=migration), spot))
        print(f"  ran {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    print(f"multi-turn episodes: {TURNS} turns, tool {args.tool_s} s, {args.groups}x{args.group_size} per step, "
          f"{args.steps - 1} steps counted; emulated (Qwen3-8B on H100, rlboost.timing), {elapsed:.1f} s wall")
    print(f"{'run':<34} {'tok/s':>8} {'tok/$':>9} {'step s':>7} {'preempt':>7} {'lost s/preempt':>14} "
          f"{'tool reruns':>11}")
    for r in rows:
        print(f"{r['run']:<34} {r['tokens_per_s']:>8.0f} {r['tokens_per_usd']:>9.0f} {r['step_s']:>7.1f} "
              f"{r['preemptions']:>7} {r['lost_s_per_preemption']:>14.1f} {r['tool_reruns']:>11}")
    base, ours, restart = rows
    ceiling = ceiling_tokens_per_usd(base, ours)
    print(f"\nceiling: {ceiling:.0f} tok/$ (every preemptible instance-second rlboost paid for generating at the "
          f"rate of one reserved engine in the reserved-only run)")
    print(json.dumps({"metric": "multi_turn_tokens_per_usd", "value": round(ours["tokens_per_usd"], 1),
                      "unit": "tokens/$", "ceiling": round(ceiling, 1), "fidelity": "emulated",
                      "peers": {"reserved_only_tokens_per_usd": round(base["tokens_per_usd"], 1),
                                "restart_episode_tokens_per_usd": round(restart["tokens_per_usd"], 1),
                                "tokens_per_s": {r["run"]: round(r["tokens_per_s"], 1) for r in rows},
                                "lost_s_per_preemption": {r["run"]: round(r["lost_s_per_preemption"], 2)
                                                          for r in rows[1:]}}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
