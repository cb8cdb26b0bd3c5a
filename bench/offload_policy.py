"""Adaptive offload window against the reference rule, as the number of preemptible instances changes.

Both policies drive the same controller over the same emulated fleet, prompts and instance
schedule on virtual time (minutes of GPU time per step run in a fraction of a second). For
each phase of constant instance count we report the step time once a policy has had
`--settle` steps to adapt, next to the ideal step time the configured rates allow.

    python bench/offload_policy.py            # table, then one JSON line
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from rlboost.controller.clock import run_virtual
from rlboost.controller.config import ControllerConfig
from rlboost.controller.offload import (
    AdaptiveWindow,
    AdaptiveWindowConfig,
    ReferenceWindowConfig,
    ReferenceWindowRule,
    ideal_step_time,
)
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.service import RolloutService
from rlboost.rollout.emulated.engine import EmulatedEngineConfig
from rlboost.sim import EmulatedFleet, EmulatedTrainerConfig, SimInstance, make_groups, run_emulated_steps


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", default="4,1,6,0,2", help="preemptible instances in each phase")
    p.add_argument("--steps-per-phase", type=int, default=7)
    p.add_argument("--settle", type=int, default=4, help="steps a policy gets to adapt after a change")
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new", type=int, default=4096)
    p.add_argument("--mean-len", type=float, default=1000.0, help="mean response length (tokens)")
    p.add_argument("--reserved-tps", type=float, default=3000.0, help="reserved engine, aggregate tok/s")
    p.add_argument("--spot-tps", type=float, default=1000.0, help="each preemptible instance, aggregate tok/s")
    p.add_argument("--sample-tps", type=float, default=50.0, help="per-sample decode tok/s")
    p.add_argument("--train-tps", type=float, default=2500.0, help="training throughput, tokens/s")
    p.add_argument("--pull-s", type=float, default=5.0, help="weight pull time of a preemptible instance")
    p.add_argument("--poll-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def engine(args, tps: float, capacity: int) -> EmulatedEngineConfig:
    return EmulatedEngineConfig(decode_tokens_per_s=tps, sample_tokens_per_s=args.sample_tps,
                                prefill_tokens_per_s=50_000.0, max_running=capacity,
                                stop_probability=1.0 / args.mean_len)


def run_policy(args, policy) -> list:
    """All phases under one policy; returns per-step (preemptible count, StepMetrics)."""
    counts = [int(x) for x in args.phases.split(",")]
    spot_capacity = max(1, args.groups * args.group_size // 4)

    async def main(clock):
        svc = RolloutService(ControllerConfig(poll_interval_s=args.poll_s, idle_timeout_s=600.0,
                                              registry=RegistryConfig(heartbeat_interval_s=1.0)),
                             clock=clock, window_policy=policy)
        await svc.start()
        fleet = EmulatedFleet(svc, clock)
        fleet.spawn(SimInstance(instance_id="reserved-0", kind="reserved", pull_s=0.0,
                                engine=engine(args, args.reserved_tps, args.groups * args.group_size)))
        live: list[str] = []
        serial = [0]

        def resize(step: int) -> None:
            want = counts[step // args.steps_per_phase]
            while len(live) > want:  # a preemption notice with the GCP grace period
                fleet.notice(live.pop(), 30.0)
            while len(live) < want:
                serial[0] += 1
                name = f"spot-{serial[0]}"
                fleet.spawn(SimInstance(instance_id=name, pull_s=args.pull_s,
                                        engine=engine(args, args.spot_tps, spot_capacity)))
                live.append(name)

        trainer = EmulatedTrainerConfig(train_s_per_token=1.0 / args.train_tps, switch_s=2.0, wait_s=600.0)
        groups = lambda s: make_groups(s, num_groups=args.groups, group_size=args.group_size,  # noqa: E731
                                       prompt_len=64, max_new_tokens=args.max_new, seed=args.seed)
        metrics = await run_emulated_steps(svc, clock, trainer, groups, len(counts) * args.steps_per_phase,
                                           before_step=resize)
        await fleet.close()
        await svc.close()
        return [(counts[m.step // args.steps_per_phase], m) for m in metrics]
    return run_virtual(main)


def ideal(args, n: int, m) -> float:
    train_s = m.total_tokens / args.train_tps + 2.0
    return ideal_step_time(m.total_tokens, train_s, args.reserved_tps, n * args.spot_tps)


def main() -> int:
    args = parse()
    t0 = time.perf_counter()
    adaptive = run_policy(args, AdaptiveWindow(AdaptiveWindowConfig(initial_window_s=150.0)))
    reference = run_policy(args, ReferenceWindowRule(ReferenceWindowConfig()))
    wall = time.perf_counter() - t0
    print(f"{'step':>4} {'spot':>4} {'tokens':>7} | {'win_A':>6} {'step_A':>7} {'idle_tr':>7} | "
          f"{'win_R':>6} {'step_R':>7} {'idle_tr':>7} | {'ideal':>6}")
    for (n, a), (_, r) in zip(adaptive, reference):
        print(f"{a.step:>4} {n:>4} {a.total_tokens:>7} | {a.window_s:>6.1f} {a.step_time_s:>7.1f} "
              f"{a.trainer_idle_s:>7.1f} | {r.window_s:>6.1f} {r.step_time_s:>7.1f} {r.trainer_idle_s:>7.1f} | "
              f"{ideal(args, n, a):>6.1f}")
    print()
    print(f"{'phase':>5} {'spot':>4} | {'adaptive':>8} {'reference':>9} {'ideal':>6} | adaptive <= reference")
    settled_a, settled_r, settled_i, verdicts = [], [], [], []
    k = args.steps_per_phase
    for p in range(len(adaptive) // k):
        rows = range(p * k + args.settle, (p + 1) * k)
        a = statistics.mean(adaptive[i][1].step_time_s for i in rows)
        r = statistics.mean(reference[i][1].step_time_s for i in rows)
        i_ = statistics.mean(ideal(args, adaptive[i][0], adaptive[i][1]) for i in rows)
        settled_a.append(a)
        settled_r.append(r)
        settled_i.append(i_)
        verdicts.append(a <= r * 1.005)  # within half a percent counts as a tie
        print(f"{p:>5} {adaptive[p * k][0]:>4} | {a:>8.1f} {r:>9.1f} {i_:>6.1f} | {'yes' if verdicts[-1] else 'NO'}")
    print(f"\nadaptive not worse in {sum(verdicts)}/{len(verdicts)} phases, settled after {args.settle} steps; "
          f"{len(adaptive) * 2} emulated steps in {wall:.1f} s of wall time")
    print(json.dumps({
        "metric": "settled_step_time_s", "value": round(statistics.mean(settled_a), 2), "unit": "s",
        "ceiling": round(statistics.mean(settled_i), 2),
        "peers": {"reference_rule": round(statistics.mean(settled_r), 2)}}))
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
