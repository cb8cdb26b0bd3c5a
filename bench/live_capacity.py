"""How fast live capacity turns a joining node into work and a noticed node into nothing lost.

On a multi-node Ray cluster of this machine (Ray's own ray.cluster_utils.Cluster, all on
127.0.0.1), `rlboost train --set cluster.capacity=live` trains the tiny model (emulated
engines, a few seconds per sample) while preemptible nodes join one after the other. Each
node gets a notice, in turn from a fake AWS metadata server (IMDSv2), a fake GCP one, and
its shutdown hook (`rlboost notice`), and then leaves; a last one is removed mid-step
without notice. Measured from the outside, at 20 ms resolution:

- join to first sample: a node is up in Ray -> the controller holds samples on its instance;
- notice to run: the cloud (or hook) says so -> the run has the node's notice;
- notice to drained: -> the node's samples have all left it (drain_margin_s = grace here, so
  the drain starts at once; by default it starts drain_margin_s before the deadline);
- the floor beside them: pulling the weights alone (a fresh puller, the run's version size),
  and a peer: a bare Ray actor started on a just-joined node;
- (unless --no-autoscaler) Ray's fake multi-node autoscaler launching 2 spot nodes for the
  run's request, and scaling them down once the run withdraws it.

The fakes and the cluster harness are the tests' (tests/fake_metadata.py, tests/live_cluster.py).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ray  # noqa: E402
import torch  # noqa: E402
from fake_metadata import FakeAwsMetadataForTests, FakeGcpMetadataForTests  # noqa: E402
from live_cluster import (  # noqa: E402
    Events,
    FakeAutoscalingHead,
    autoscaler_round,
    connected,
    live_overrides,
    local_cluster,
    notice,
    start_run,
    stop_run,
)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from rlboost.transfer import TransferConfig, WeightPublisher, WeightPuller, new_secret  # noqa: E402

SOURCES = ("aws", "gcp", "hook")


def _actor_start_s(node: str) -> float:
    """A bare actor on the node: what any Ray program pays before its first call there."""
    class BareActorOnTheNode:
        def ping(self) -> int:
            return os.getpid()

    t0 = time.monotonic()
    actor = ray.remote(BareActorOnTheNode).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    ray.get(actor.ping.remote(), timeout=120)
    ray.kill(actor)
    return time.monotonic() - t0


def _pull_floor_s(nbytes: int, repeats: int = 5) -> float:
    """Median seconds a fresh puller (new connection and login) takes to pull nbytes of weights."""
    weights = {"w": torch.zeros(max(1, nbytes // 4), dtype=torch.float32)}
    transfer = TransferConfig(secret=new_secret())
    times = []
    with WeightPublisher(transfer) as pub:
        pub.publish(1, weights)
        for _ in range(repeats):
            t0 = time.monotonic()
            with WeightPuller(pub.address, transfer) as puller:
                puller.pull(1)
            times.append(time.monotonic() - t0)
    return statistics.median(times)


def _cycle(cluster, events: Events, clouds: dict, hooks: Path, source: str, grace_s: float) -> dict:
    """One node: joins, serves, gets a notice from `source`, drains, leaves."""
    for fake in clouds.values():
        fake.reset()
    node = cluster.add("none" if source == "hook" else source)
    joined = time.monotonic()
    events.wait(events.on_node(node, "first_sample"), 180, f"a first sample on node {node[:8]}")
    first = time.monotonic() - joined
    t0 = time.monotonic()
    if source == "hook":
        hook = notice(hooks, grace_s, node=node)
        if hook.returncode != 0:
            raise RuntimeError(f"rlboost notice failed: {hook.stderr}")
    else:
        clouds[source].notify(grace_s)
    events.wait(lambda e: e["kind"] == "node" and e["action"] == "noticed" and e["node"] == node, 60,
                f"the notice of node {node[:8]}")
    to_run = time.monotonic() - t0
    events.wait(events.on_node(node, "drained"), grace_s + 30, f"node {node[:8]} drained")
    drained = time.monotonic() - t0
    peer = _actor_start_s(node)
    cluster.remove(node)  # the cloud takes it
    return {"source": source, "join_to_first_sample_s": first, "notice_to_run_s": to_run,
            "notice_to_drained_s": drained, "ray_actor_start_s": peer}


def _death(cluster, events: Events) -> dict:
    node = cluster.add()
    events.wait(events.on_node(node, "first_sample"), 180, "a first sample on the last node")
    cluster.remove(node)  # mid-step, without notice
    death = events.wait(events.on_node(node, "death"), 60, "the last node's instance ended")
    return {"samples_resumed": death.get("samples_resumed", 0)}


def live_round(work: Path, joins: int, grace_s: float) -> tuple[list[dict], dict]:
    runs, hooks = work / "runs", work / "n"
    with FakeAwsMetadataForTests() as aws, FakeGcpMetadataForTests() as gcp, local_cluster(work / "w") as cluster:
        overrides = live_overrides(hooks, steps=10_000, **{
            "cluster.notices.aws_url": aws.url, "cluster.notices.gcp_url": gcp.url,
            "cluster.notices.gcp_grace_s": grace_s, "controller.registry.drain_margin_s": grace_s})
        proc = start_run(cluster, runs, overrides, work / "cwd")
        events = Events(runs)
        try:
            events.wait(lambda e: e["kind"] == "capacity", 600, "the run's start")
            events.wait(lambda e: events.steps_done() >= 1, 600, "the first step")
            cycles = [_cycle(cluster, events, {"aws": aws, "gcp": gcp}, hooks, SOURCES[i % 3], grace_s)
                      for i in range(joins)]
            death = _death(cluster, events)
        finally:
            code, _, err = stop_run(proc)
    if code != 130:
        raise RuntimeError(f"the run ended with {code}:\n{err[-3000:]}")
    metrics = events.metrics()
    lost = sum(m["samples"] - m["samples_unique"] for m in metrics)
    duplicated = sum(m["samples_trained"] - m["samples_unique"] for m in metrics)
    run = {"steps": len(metrics), "samples_lost": lost, "samples_duplicated": duplicated,
           "version_bytes": max(m.get("weight_version_bytes", 0) for m in metrics), **death}
    return cycles, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--joins", type=int, default=6, help="nodes that join and get a notice (>= 5 for the figure)")
    parser.add_argument("--grace", type=float, default=20.0, help="each notice's grace, seconds")
    parser.add_argument("--no-autoscaler", action="store_true", help="skip the autoscaler round")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rlblive-"))
    load = [os.getloadavg()[0]]  # this machine is shared: say how busy it was
    cycles, run = live_round(work, args.joins, args.grace)
    load.append(os.getloadavg()[0])
    floor = _pull_floor_s(run["version_bytes"])
    scale = {}
    if not args.no_autoscaler:
        head = FakeAutoscalingHead(Path(tempfile.mkdtemp(prefix="rlbas-")), max_workers=2)
        try:
            head.start()
            with connected(head.address, head.token):
                got = autoscaler_round(head, work / "as-runs", live_overrides(work / "as-n", steps=10_000, **{
                    "cluster.max_preemptible": 2}), work / "as-cwd", count=2)
            scale = {k: got[k] for k in ("up_s", "served_s", "down_s")}
        finally:
            head.stop()

    def col(key: str) -> list[float]:
        return [c[key] for c in cycles]

    print(f"{'node':>4}  {'notice':>6}  {'join->sample s':>14}  {'notice->run s':>13}  {'notice->drained s':>17}  "
          f"{'bare actor s':>12}")
    for i, c in enumerate(cycles):
        print(f"{i:>4}  {c['source']:>6}  {c['join_to_first_sample_s']:>14.2f}  {c['notice_to_run_s']:>13.3f}  "
              f"{c['notice_to_drained_s']:>17.2f}  {c['ray_actor_start_s']:>12.2f}")
    first, drained, to_run = col("join_to_first_sample_s"), col("notice_to_drained_s"), col("notice_to_run_s")
    print(f"join to first sample: median {statistics.median(first):.2f} s, max {max(first):.2f} s "
          f"(floor, the weights' pull alone ({run['version_bytes'] / 1e6:.2f} MB): {floor * 1000:.1f} ms; "
          f"peer, a bare Ray actor on a new node: median {statistics.median(col('ray_actor_start_s')):.2f} s)")
    print(f"notice to run: max {max(to_run):.3f} s; notice to drained: median {statistics.median(drained):.2f} s, "
          f"max {max(drained):.2f} s (grace {args.grace:g} s)")
    print(f"run: {run['steps']} steps, samples lost {run['samples_lost']}, duplicated {run['samples_duplicated']}; "
          f"a node removed mid-step: {run['samples_resumed']} samples resumed elsewhere")
    print(f"machine: {os.cpu_count()} cores, 1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} "
          "after the live round")
    if scale:
        print(f"autoscaler (fake multi-node provider): 2 spot nodes {scale['up_s']:.1f} s after the request, serving "
              f"{scale['served_s']:.1f} s after it; scaled down {scale['down_s']:.1f} s after the run withdrew it")
    print(json.dumps({"metric": "join_to_first_sample_median_s", "value": round(statistics.median(first), 3),
                      "unit": "s", "ceiling": round(floor, 4), "peers": {
                          "join_to_first_sample_max_s": round(max(first), 3),
                          "ray_bare_actor_start_median_s": round(statistics.median(col("ray_actor_start_s")), 3),
                          "notice_to_run_max_s": round(max(to_run), 3),
                          "notice_to_drained_median_s": round(statistics.median(drained), 3),
                          "notice_to_drained_max_s": round(max(drained), 3), "grace_s": args.grace,
                          "joins": len(cycles), "notices": len(cycles), "samples_lost": run["samples_lost"],
                          "samples_duplicated": run["samples_duplicated"], "load_average": [round(x, 1) for x in load],
                          **{f"autoscaler_{k}": round(v, 2) for k, v in scale.items()}}}))


if __name__ == "__main__":
    main()
