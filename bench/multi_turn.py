"""Multi-turn, tool-using rollouts on preemptible capacity, in the emulated fleet at the
RLBoost artifact's proportions (recipes/paper_qwen3_8b: Qwen3-8B engines on H100s as
rlboost.timing models them, one reserved 8x H100 node as four TP-2 engines, preemptible TP-2
instances at a quarter of a spot node's price; the artifact's 128 prompts x 8 samples a step).

Every sample is an episode of 4 model turns: each of the first three ends with a tool call,
whose answer takes 0.5-5 s (modelled; drawn per sample and turn) and comes back as an
observation of 128 tokens. The controller, its episode driver, the router, migrations and
the engines' token streams are rlboost's own code on virtual time; the tool is emulated (it
waits its latency on the controller's clock and answers with fixed tokens), the engines and
the trainer take the timing model's time. Four runs over the same prompts and seeds:

- reserved only: the four reserved engines;
- never preempted: plus four preemptible instances that stay (what preemptions leave of it);
- rlboost: the same instances preempted on a schedule that starts with the first counted
  step (--preemptions of them, one at a seeded random moment of each --preempt-every-s, a
  notice then a sudden death in turn, the oldest instance first, each replaced --replace-s
  later); a preempted episode resumes from its last collected token, its tool results kept;
- restart: the same schedule, but a preempted episode starts again from its prompt and its
  tools run again (controller.migration=recompute: what a system without migration does).

Figures, over the counted steps (the first fills the pipeline): tokens/s and tokens per
dollar (the reserved node billed throughout, each preemptible instance from its start or
join to its preemption, a noticed one to its deadline); per preemption, the episode time it
cost, from the controller's own split of its metrics (StepMetrics.preempted_*; the window's
handovers, steals and next turns are not preemptions): model tokens generated again (those a
restart discarded, and those a dead engine made after the controller's last poll, read from
the engine as it dies; at one sample's decode rate), the prompt and tokens prefilled again
because a preemption moved the episode (at the engine's prefill rate), and the tool calls
run again (their latency). The ceiling is every engine-second paid for in the rlboost run
generating at one reserved engine's rate in the reserved-only run. Fidelity: emulated.

    python bench/multi_turn.py            # table, then one JSON line
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import statistics
import sys
import time
from collections import Counter

from rlboost.controller.clock import run_virtual
from rlboost.controller.service import RolloutService
from rlboost.environments.turns import TurnAnswer
from rlboost.errors import RolloutError
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
    p.add_argument("--steps", type=int, default=5, help="steps, the first not counted")
    p.add_argument("--groups", type=int, default=128)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--turn-tokens", type=float, default=750.0, help="mean model tokens of one turn (real tokens)")
    p.add_argument("--tool-s", default="0.5,5.0", help="tool latency range, modelled seconds")
    p.add_argument("--spot", type=int, default=4, help="preemptible instances")
    p.add_argument("--preemptions", type=int, default=12, help="preemptions, notice and sudden death in turn")
    p.add_argument("--preempt-every-s", type=float, default=45.0,
                   help="modelled seconds between preemptions, on average (one in each slot this long)")
    p.add_argument("--replace-s", type=float, default=60.0, help="modelled seconds until a preempted one is replaced")
    p.add_argument("--grace-s", type=float, default=30.0, help="a notice's grace period, modelled seconds")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.steps < 2:
        p.error(f"--steps must be at least 2 (the first step is a warm-up and not counted), got {args.steps}")
    if min(args.groups, args.group_size, args.spot) < 1 or args.preemptions < 0:
        p.error("--groups, --group-size and --spot must be at least 1, --preemptions at least 0")
    return args


def run_s(modelled_s: float) -> float:
    return modelled_s / TIME_SCALE


class EmulatedToolHost:
    """Answers each turn as the episode driver asks (rlboost.environments.turns.EpisodeHost's
    answer/close), after the tool's latency on the controller's clock. It keeps no record: a
    turn asked again is run again, as by an episode that restarts; calls counts each turn's
    executions (forget() starts the count again)."""

    def __init__(self, clock, latency: tuple[float, float]):
        self.clock, self.latency = clock, latency
        self.calls: Counter[tuple[int, int]] = Counter()

    def latency_of(self, sample_id: int, turn: int) -> float:
        u = int.from_bytes(hashlib.blake2b(f"{sample_id}/{turn}".encode(), digest_size=8).digest(), "little") / 2**64
        lo, hi = self.latency
        return run_s(lo + (hi - lo) * u)

    def forget(self) -> None:
        self.calls.clear()

    def again_s(self) -> tuple[int, float]:
        """Tool calls run more than once, and their latency (modelled seconds)."""
        again = [(n - 1, self.latency_of(s, t)) for (s, t), n in self.calls.items() if n > 1 and t < TURNS - 1]
        return sum(n for n, _ in again), sum(n * wait for n, wait in again) * TIME_SCALE

    async def answer(self, sample_id: int, turn: int, token_ids, finish_reason: str) -> TurnAnswer:
        wait = self.latency_of(sample_id, turn) if turn < TURNS - 1 else 0.0
        self.calls[(sample_id, turn)] += 1
        await self.clock.asleep(wait)
        if turn >= TURNS - 1:
            return TurnAnswer(sample_id=sample_id, turn=turn, observation_ids=(), done=True, replayed=False)
        ids = (7,) * max(1, OBSERVATION_TOKENS // TOKEN_BLOCK)
        return TurnAnswer(sample_id=sample_id, turn=turn, observation_ids=ids, done=False, replayed=False)

    async def close(self, sample_id: int) -> None:
        return None


class TallyingFleet(EmulatedFleet):
    """The emulated fleet, counting the tokens each dying engine made since the controller's
    last poll: they die with it and are generated again elsewhere."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.uncollected = 0

    def kill(self, instance_id: str) -> None:
        try:
            self.uncollected += sum(len(d.ids) for d in self.engines[instance_id].poll(0.0))
        except RolloutError:
            pass  # closed: drained and let go before its deadline
        super().kill(instance_id)


def engine(args):
    # a turn ends at the engine's end token, one chance in turn_tokens per real token
    return dataclasses.replace(paper_engine(), lengths=LengthConfig(kind="geometric"),
                               stop_probability=min(1.0, TOKEN_BLOCK / args.turn_tokens))


def schedule(args, spot: int) -> list[FleetEvent]:
    """args.preemptions preemptions, the k-th at a seeded random moment of the k-th slot of
    preempt_every_s (so they meet every phase of a step): a notice, then a sudden death, in
    turn, each of the oldest instance up by then, replaced replace_s later."""
    rng, spec = random.Random(args.seed), engine(args)
    events, up = [], [(0.0, f"spot-{i}") for i in range(spot)]  # (joins at, name), oldest first
    for k in range(args.preemptions if spot else 0):
        at = max(run_s(args.preempt_every_s) * (k + rng.random()), up[0][0])
        _, victim = up.pop(0)
        events.append(FleetEvent(at_s=at, kind="notice" if k % 2 == 0 else "death", instance_id=victim,
                                 grace_s=run_s(args.grace_s)))
        name = f"spot-{spot + k}"
        events.append(FleetEvent(at_s=at + run_s(args.replace_s), kind="join", instance_id=name,
                                 spec=SimInstance(instance_id=name, engine=spec, pull_s=run_s(20.0))))
        up = sorted(up + [(at + run_s(args.replace_s), name)])
    return sorted(events, key=lambda e: e.at_s)

def run(args, *, spot: int, preempt: bool = True, migration: str = "continue") -> dict:
    """One run on virtual time; the preemption schedule starts with the first counted step."""
    controller = dataclasses.replace(paper_controller(), migration=migration, idle_timeout_s=600.0)
    lo, hi = (float(x) for x in args.tool_s.split(","))
    events = schedule(args, spot) if preempt else []
    out: dict = {"events": events}

    async def main(clock):
        svc = RolloutService(controller, clock=clock)
        host = EmulatedToolHost(clock, (lo, hi))
        svc.attach_environments(host)
        await svc.start()
        fleet = TallyingFleet(svc, clock)
        for i in range(NODE_GPUS // ENGINE_GPUS):
            fleet.spawn(SimInstance(instance_id=f"reserved-{i}", kind="reserved", pull_s=0.0, engine=engine(args)))
        for i in range(spot):
            fleet.spawn(SimInstance(instance_id=f"spot-{i}", engine=engine(args), pull_s=run_s(20.0)))

        def counted_from(step: int) -> None:
            if step == 1:
                out["t0"] = clock.now()
                host.forget()
                fleet.schedule(events)
        # the 8-GPU trainer's time per token of a typical episode (prompt + 4 turns + 3 observations)
        per_token = TrainerTiming(engine(args), NODE_GPUS).microbatch_s([EPISODE_TOKENS]) / EPISODE_TOKENS
        trainer = EmulatedTrainerConfig(train_s_per_token=per_token, switch_s=run_s(5.0), wait_s=600.0)
        groups = lambda s: make_groups(s, num_groups=args.groups, group_size=args.group_size,  # noqa: E731
                                       prompt_len=5, max_new_tokens=14_336 // TOKEN_BLOCK, seed=args.seed)
        out["metrics"] = await run_emulated_steps(svc, clock, trainer, groups, args.steps, before_step=counted_from)
        out["t1"], out["host"], out["uncollected"] = clock.now(), host, fleet.uncollected
        await fleet.close()
        await svc.close()
    run_virtual(main)
    return out


def spot_seconds(spot: int, events: list[FleetEvent], t0: float, t1: float) -> float:
    """Preemptible instance-seconds billed between t0 and t1 (the schedule's times count from
    t0): each from its start (or join) to its preemption (a noticed one to its deadline)."""
    start = {f"spot-{i}": 0.0 for i in range(spot)}
    total = 0.0
    for e in events:
        if e.kind == "join":
            start[e.instance_id] = e.at_s
        elif e.instance_id in start:
            total += max(0.0, min(t1 - t0, e.at_s + (e.grace_s if e.kind == "notice" else 0.0))
                         - min(t1 - t0, start.pop(e.instance_id)))
    return total + sum(max(0.0, t1 - t0 - min(t1 - t0, s)) for s in start.values())


def lost(res: dict) -> dict:
    """What the counted steps' preemptions cost, in modelled episode-seconds: model tokens
    generated again at one sample's decode rate, tokens prefilled again at the engine's
    prefill rate, and tool calls run again at their latency."""
    timing = gpu_timing("qwen3-8b", "h100-sxm", ENGINE_GPUS)
    sample_tps = 1.0 / timing.decode_step_s(64, 64 * 2_000.0)  # one sample in a busy engine, real tokens/s
    prefill_tps = 4_096 / timing.prefill_s(4_096)
    m = res["metrics"][1:]
    regenerated = (sum(x.preempted_regenerated_tokens for x in m) + res["uncollected"]) * TOKEN_BLOCK
    reprefill = sum(x.preempted_reprefill_tokens for x in m) * TOKEN_BLOCK
    tools, tools_s = res["host"].again_s()
    parts = {"decode_s": regenerated / sample_tps, "prefill_s": reprefill / prefill_tps, "tools_s": tools_s}
    return {"notices": sum(x.preemptions for x in m), "deaths": sum(x.deaths for x in m),
            "samples_moved": sum(x.preempted_samples for x in m), "regenerated_tokens": regenerated,
            "reprefill_tokens": reprefill, "tool_reruns": tools, **parts, "lost_s": sum(parts.values())}

def figures(name: str, res: dict, spot: int) -> dict:
    m = res["metrics"][1:]  # the first step fills the pipeline
    tokens = sum(x.total_tokens for x in m) * TOKEN_BLOCK
    wall = (res["t1"] - res["t0"]) * TIME_SCALE
    spot_s = spot_seconds(spot, res["events"], res["t0"], res["t1"]) * TIME_SCALE
    dollars = (wall * ON_DEMAND_NODE_USD_H + spot_s * SPOT_NODE_USD_H * ENGINE_GPUS / NODE_GPUS) / 3600.0
    cost = lost(res)
    preemptions = cost["notices"] + cost["deaths"]
    return {"run": name, "tokens_per_s": tokens / wall, "tokens_per_usd": tokens / dollars, **cost,
            "preemptions": preemptions,
            "lost_s_per_preemption": cost["lost_s"] / preemptions if preemptions else 0.0,
            "step_s": statistics.mean(x.step_time_s for x in m) * TIME_SCALE,
            "rollout_s": statistics.mean(x.rollout_time_s for x in m) * TIME_SCALE, "wall_s": wall, "usd": dollars,
            "spot_s": spot_s}


def ceiling_tokens_per_usd(base: dict, ours: dict) -> float:
    per_engine = base["tokens_per_s"] / (NODE_GPUS // ENGINE_GPUS)
    tokens = per_engine * ((NODE_GPUS // ENGINE_GPUS) * ours["wall_s"] + ours["spot_s"])
    return tokens / ours["usd"]


RUNS = (("reserved only", 0, False, "continue"), ("never preempted", None, False, "continue"),
        ("rlboost (resume from last token)", None, True, "continue"),
        ("restart the episode", None, True, "recompute"))


def table(args, rows: list[dict], elapsed: float) -> None:
    print(f"multi-turn episodes: {TURNS} turns, tool {args.tool_s} s, {args.groups}x{args.group_size} per step, "
          f"{args.steps - 1} steps counted, {args.preemptions} preemptions scheduled every {args.preempt_every_s:g} s "
          f"from the first counted step; emulated (Qwen3-8B on H100, rlboost.timing), {elapsed:.1f} s wall")
    print(f"{'':<34} {'':>7} {'':>8} {'':>7} {'rollout':>7} {'preempted':>10} {'episodes':>8} {'tool':>6} "
          f"{'episode s lost per preemption':>36}")
    print(f"{'run':<34} {'tok/s':>7} {'tok/$':>8} {'step s':>7} {'s':>7} {'notice/sud':>10} {'moved/p':>8} "
          f"{'again':>6} {'all':>7} {'decode':>8} {'prefill':>8} {'tools':>8}")
    for r in rows:
        n = max(1, r["preemptions"])
        print(f"{r['run']:<34} {r['tokens_per_s']:>7.0f} {r['tokens_per_usd']:>8.0f} {r['step_s']:>7.1f} "
              f"{r['rollout_s']:>7.1f} {r['notices']:>5}/{r['deaths']:<4} {r['samples_moved'] / n:>8.1f} "
              f"{r['tool_reruns']:>6} "
              f"{r['lost_s'] / n:>7.1f} {r['decode_s'] / n:>8.1f} {r['prefill_s'] / n:>8.1f} {r['tools_s'] / n:>8.1f}")


def main() -> int:
    args = parse()
    t0 = time.perf_counter()
    rows = []
    for name, spot, preempt, migration in RUNS:
        spot = args.spot if spot is None else spot
        rows.append(figures(name, run(args, spot=spot, preempt=preempt, migration=migration), spot))
        print(f"  ran {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    table(args, rows, time.perf_counter() - t0)
    for r in rows[2:]:
        if r["preemptions"] != args.preemptions:
            print(f"note: {r['run']} met {r['preemptions']} of the {args.preemptions} scheduled preemptions "
                  "in its counted steps (more --steps, or a shorter --preempt-every-s, fit them all)")
    base, calm, ours, restart = rows
    ceiling = ceiling_tokens_per_usd(base, ours)
    print(f"\nceiling: {ceiling:.0f} tok/$ (every engine-second the rlboost run paid for generating at the rate of "
          f"one reserved engine in the reserved-only run)")
    print(json.dumps({"metric": "multi_turn_tokens_per_usd", "value": round(ours["tokens_per_usd"], 1),
                      "unit": "tokens/$", "ceiling": round(ceiling, 1), "fidelity": "emulated",
                      "peers": {"reserved_only_tokens_per_usd": round(base["tokens_per_usd"], 1),
                                "never_preempted_tokens_per_usd": round(calm["tokens_per_usd"], 1),
                                "restart_episode_tokens_per_usd": round(restart["tokens_per_usd"], 1),
                                "tokens_per_s": {r["run"]: round(r["tokens_per_s"], 1) for r in rows},
                                "preemptions": {r["run"]: [r["notices"], r["deaths"]] for r in rows[2:]},
                                "lost_s_per_preemption": {r["run"]: round(r["lost_s_per_preemption"], 2)
                                                          for r in rows[2:]},
                                "tool_reruns": {r["run"]: r["tool_reruns"] for r in rows[2:]}}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
