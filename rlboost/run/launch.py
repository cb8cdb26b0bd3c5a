"""The processes of one run, built from its RunConfig: the controller actor, the FSDP
trainer group, the rollout fleet and its capacity source (a trace replay, or the live Ray
cluster's nodes); and the calls a step makes on them.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlboost.cluster.capacity import CapacitySource, InstanceSlot, build_capacity, resolve_kind
from rlboost.cluster.capacity.trace import TracePlan
from rlboost.cluster.capacity.trace import plan_trace as plan_cluster_trace
from rlboost.cluster.config import parse_injection
from rlboost.cluster.cost import CostLedger
from rlboost.cluster.environment_host import start_environment_host
from rlboost.cluster.fleet import Fleet
from rlboost.cluster.instance import InstanceSpec
from rlboost.cluster.placement import GpuNeeds
from rlboost.cluster.session import RaySettings, actor_options, join_address, process_info
from rlboost.cluster.traces.replay import notice_seconds
from rlboost.config.run import RunConfig
from rlboost.controller.actor import RolloutController
from rlboost.controller.metrics import StepMetrics
from rlboost.run.directory import RunDirectory
from rlboost.trainer.emulated import EmulatedTrainerSpec, TrainerTiming, emulates_trainer, launch_emulated
from rlboost.trainer.loop import TrainerGroup
from rlboost.trainer.rank import RankSpec
from rlboost.transfer import run_secret
from rlboost.transfer.config import checkpoint_payload_bytes, version_bytes_bound

READY_TIMEOUT_S = 600.0
DEATH_CHECK_S = 3.0  # a dead actor answers at once; a live one busy in a collective may not


def plan_trace(config: RunConfig, steps: int, step_s: float, duration_s: float | None = None) -> TracePlan:
    """The run's trace plan (capacity/trace.py's plan_trace of its cluster section)."""
    return plan_cluster_trace(config.cluster, steps, step_s, duration_s, time_scale=config.cost.time_scale)


def capacity_kind(config: RunConfig) -> str:
    """trace or live: cluster.capacity, with `auto` resolved by whether the run joins a Ray
    cluster (ConfigError for live on a local one)."""
    return resolve_kind(config.cluster.capacity, joined=bool(join_address(config.cluster.address)))


def gpu_needs(config: RunConfig) -> GpuNeeds:
    """The GPUs the run's processes ask Ray for (none on a CPU run). Live capacity asks for
    no preemptible GPUs up front: its nodes come and go, and each holds what it holds."""
    t, r, c = config.trainer, config.rollout, config.cluster
    preemptible = 0 if capacity_kind(config) == "live" else c.max_preemptible
    return GpuNeeds(trainer_ranks=t.world_size, gpus_per_rank=t.rank_gpus, reserved_engines=c.reserved_instances,
                    gpus_per_engine=r.instance_gpus, preemptible=preemptible, gpus_per_instance=r.instance_gpus)


def ray_settings(config: RunConfig, plan: TracePlan, worker_dir: str | None = None) -> RaySettings:
    c = config.cluster
    joins = sum(1 for e in plan.events if e.kind == "join")
    return RaySettings(address=c.address, num_cpus=c.num_cpus, object_store_mb=c.object_store_mb,
                       reserved=config.trainer.world_size + c.reserved_instances,
                       preemptible=max(1, joins + c.initial_preemptible), worker_dir=worker_dir,
                       gpus=gpu_needs(config), preemptible_required=capacity_kind(config) != "live")


class Cluster:
    """The run's actors and the calls one step makes on them."""

    def __init__(self, config: RunConfig, run: RunDirectory, ledger: CostLedger, *, weights: Path,
                 reference: Path, optimizer_state: str | None, billed_from: float | None = None,
                 say: Callable[[str], None] = print):
        # one secret for every weight server and puller of the run, carried to them by Ray;
        # never written to config.json (which drops bytes) or logged
        secret = config.transfer.secret or run_secret()
        config = dataclasses.replace(config, transfer=dataclasses.replace(
            config.transfer, secret=secret, max_version_bytes=version_bound(config, weights)))
        self.config, self.run, self.ledger, self.say = config, run, ledger, say
        self.capacity: CapacitySource | None = None
        self.rendezvous: Path | None = None  # the file rendezvous, removed at close
        self.controller = self.trainer = self.fleet = self.environments = None
        self.injections: dict[int, list[str]] = {}
        self.started_ahead: set[int] = set()  # steps whose rollout started while an earlier one ran
        for item in config.cluster.inject:
            kind, step = parse_injection(item)
            self.injections.setdefault(step, []).append(kind)
        try:
            self._launch(weights, reference, optimizer_state, billed_from)
        except BaseException:
            self.close(failed=True)
            raise

    def _launch(self, weights: Path, reference: Path, optimizer_state: str | None,
                billed_from: float | None) -> None:
        config, run = self.config, self.run
        t, r = config.trainer, config.rollout
        options = actor_options("reserved", cpus=t.rank_cpus, gpus=t.rank_gpus)
        node = only_node(config)
        if node is not None:  # rank 0 can only be there: the controller starts beside the ranks, not after
            self.controller = start_controller(config, node)
        if emulates_trainer(r):  # engines emulating a named model: the trainer takes its time too
            self.trainer = launch_emulated(EmulatedTrainerSpec(emulated=r.emulated, gpus=t.world_size,
                                                               checkpoint=str(weights), transfer=config.transfer),
                                           config.cost, options)
        else:
            self.trainer = TrainerGroup.launch(rank_specs(config, weights, reference), options)
        publisher = ray.get(self.trainer.ranks[0].address.remote(), timeout=READY_TIMEOUT_S)
        if self.controller is None:  # beside trainer rank 0, on a reserved node: a preemptible node's death must not take it
            node = ray.get(self.trainer.ranks[0].__ray_call__.remote(  # a lambda travels by value
                lambda _rank: ray.get_runtime_context().get_node_id()), timeout=READY_TIMEOUT_S)
            self.controller = start_controller(config, node)
        if config.environment.multi_turn:  # off the preemptible nodes, before any sample is placed
            self.environments = start_environment_host(config.environment, tokenizer_dir=str(reference),
                                                       chat=config.task.chat_template)
            ray.get(self.controller.attach_environments.remote(self.environments), timeout=READY_TIMEOUT_S)
        self.fleet = Fleet(self.controller, instance_template(config, weights, publisher),
                           lambda kind: actor_options(kind, cpus=r.instance_cpus, gpus=r.instance_gpus),
                           self.ledger, run.append_event, run.elapsed)
        # a restart keeps the reserved cluster billed through its relaunch: its machines are held
        billed = run.elapsed() if billed_from is None else billed_from
        self.ledger.start("reserved-cluster", "reserved", at_s=billed)
        for i in range(config.cluster.reserved_instances):  # engines start while the trainer loads
            self.fleet.join(f"reserved-{i}", "reserved")
        for i in range(config.cluster.initial_preemptible):
            self.fleet.join(f"spot-s{i}", "preemptible")
        self.capacity = build_capacity(capacity_kind(config), config.cluster, self.fleet,
                                       slot=InstanceSlot(cpus=r.instance_cpus, gpus=r.instance_gpus),
                                       record=run.append_event, say=self.say, time_scale=config.cost.time_scale)
        init = None
        if t.rendezvous == "file":  # a folder every rank sees: the run directory on one machine
            folder = Path(t.rendezvous_dir).expanduser() if t.rendezvous_dir else run.path
            if not t.rendezvous_dir:  # left by a driver that was killed; a shared folder holds other runs' too
                for stale in run.path.glob(".rendezvous-*"):
                    stale.unlink(missing_ok=True)
            self.rendezvous = folder.resolve() / f".rendezvous-{time.time_ns()}"
            init = f"file://{self.rendezvous}"
        self.trainer.setup(init, optimizer_state)
        where = [a.__ray_call__.remote(process_info) for a in (self.controller, *self.trainer.ranks)]
        controller, *ranks = ray.get(where, timeout=READY_TIMEOUT_S)
        run.append_event("processes", controller=controller, trainer_ranks=ranks)

    def begin(self, version: int, resume: dict | None = None) -> None:
        """Serve the first version, wait until the reserved engines hold it, then start the
        capacity source (resume: the position a checkpoint saved)."""
        self.publish(version)
        self.fleet.wait_version(version, "reserved", READY_TIMEOUT_S)
        self.capacity.start(resume)

    def after_step(self, step: int, step_s: float) -> None:
        self.capacity.after_step(step, step_s, self.config.run.steps - step)

    def trace_position(self) -> dict | None:
        """Where the capacity source stands, for a checkpoint (a trace: {"duration_s", "offset_s"})."""
        return self.capacity.position() if self.capacity is not None else None

    def wait_for_weights(self, version: int) -> None:
        self.fleet.wait_version(version, "reserved", self.config.rollout.pull_timeout_s)

    def start_rollout(self, step: int, groups: list, ahead: bool = False) -> float:
        """Hand the step's groups to the controller (samples must come from version `step`;
        ahead: from version step - max_staleness on, the step started while an earlier one
        runs; its prompts take free slots once every earlier step's are placed)."""
        planned = ray.get(self.controller.start_step.remote(step, groups, step, ahead))
        if ahead:
            self.started_ahead.add(step)
        for kind in self.injections.get(step, ()):
            self._inject(kind)
        return planned

    def join_reserved(self, step: int) -> float:
        """The reserved engines hold the version of the step started ahead: they join its rollout."""
        self.started_ahead.discard(step)
        return ray.get(self.controller.join_reserved.remote())

    def wait_window_closed(self) -> None:
        while not ray.get(self.controller.wait_window_closed.remote(1.0)):
            self._check_replay()

    def next_microbatch(self, timeout_s: float):
        """The controller's next batch of complete groups, or None. When only the reserved
        engines can finish what is queued (no preemptible instance can), lend them back for
        rollout and wait until the controller hands them over again before training on."""
        self._check_replay()
        batch = ray.get(self.controller.next_microbatch.remote(timeout_s))
        if batch is None and ray.get(self.controller.reserved_needed.remote()):
            ray.get(self.controller.lend_reserved.remote())
            self.wait_window_closed()
        return batch

    def end_rollout(self) -> StepMetrics:
        metrics = ray.get(self.controller.end_step.remote())
        self.ledger.add_tokens(metrics.total_tokens)
        return metrics

    def publish(self, version: int) -> dict:
        """Publish the trainer's weights as `version` and make it current (the controller
        tells every instance at once)."""
        out = self.trainer.publish(version)
        ray.get(self.controller.set_weight_version.remote(version))
        return out

    def open_episodes(self, groups: list) -> list[str]:
        """Open every sample's episode on the environment host (a multi-turn run; see
        trainer.feed.Episodes)."""
        return ray.get(self.environments.open_groups.remote(groups), timeout=READY_TIMEOUT_S)

    def environment_executions(self) -> int:
        """Environment steps the host has executed so far (each tool call once)."""
        return ray.get(self.environments.stats.remote(), timeout=READY_TIMEOUT_S).executions

    def save_checkpoint(self, directory: Path, tokenizer_dir: Path) -> None:
        self.trainer.save_checkpoint(str(directory), str(tokenizer_dir))

    def _inject(self, kind: str) -> None:
        victim = self.fleet.oldest("preemptible")
        if victim is None:
            return
        self.fleet.wait_busy(victim, timeout_s=5.0)  # so the preemption meets work in flight
        if kind == "notice":
            self.fleet.notice(victim, notice_seconds(self.config.cluster, time_scale=self.config.cost.time_scale))
        else:
            self.fleet.kill(victim)

    def _check_replay(self) -> None:
        if self.capacity is not None:
            self.capacity.check()

    def dead_processes(self) -> list[str]:
        """The run's own processes that have died ("the controller", "trainer rank 1"),
        found by a call every live actor answers at once: a dead one answers with its death."""
        named = [("the controller", self.controller)] if self.controller is not None else []
        if self.trainer is not None:
            named += [(f"trainer rank {r}", rank) for r, rank in enumerate(self.trainer.ranks)]
        if not named:
            return []
        try:
            pings = {actor.__ray_ready__.remote(): name for name, actor in named}
            answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=DEATH_CHECK_S)
        except Exception:  # Ray itself is failing: no process can be named
            return []
        dead = []
        for ref in answered:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                dead.append(pings[ref])
        return sorted(dead)

    def close(self, failed: bool = False) -> None:
        """Stop the capacity source (withdrawing what it asked for), the instances, the
        controller and the trainer (in that order);
        whatever was started, even by a launch that failed half way. failed: a process may
        be dead or stuck in a collective, so the live ones get seconds, not minutes, to
        leave cleanly before they are killed; the reserved cluster is still billed."""
        wait_s = 2.0 if failed else 30.0
        if self.capacity is not None:
            self.capacity.stop()
        if self.fleet is not None:
            self.fleet.close()
        if self.controller is not None:
            try:
                ray.get(self.controller.close.remote(), timeout=wait_s)
            except Exception:  # shutting down anyway
                pass
            ray.kill(self.controller)
        if self.trainer is not None:
            self.trainer.close(timeout_s=2 * wait_s)
        if self.environments is not None:
            ray.kill(self.environments)
        if self.rendezvous is not None:  # the ranks have left their process group
            self.rendezvous.unlink(missing_ok=True)
        if "reserved-cluster" in self.ledger.running() and not failed:
            # after a failure its machines stay held (and billed) until the run is launched again
            self.ledger.stop("reserved-cluster", at_s=self.run.elapsed())


def version_bound(config: RunConfig, weights: Path) -> int:
    """transfer.max_version_bytes from the model this run trains (with a margin), unless
    the config names a smaller bound: no source can make a puller take a larger version."""
    t = config.transfer
    if emulates_trainer(config.rollout):
        payload = TrainerTiming(config.rollout.emulated, config.trainer.world_size).payload_bytes(
            t.publisher.egress_bytes_per_s)
    else:
        payload = checkpoint_payload_bytes(weights, t.alignment)
    return min(t.max_version_bytes, version_bytes_bound(payload))


def only_node(config: RunConfig) -> str | None:
    """The node id of a local cluster's one node (None: the run joins a cluster, or Ray's holds
    several nodes). A local cluster gains no node while the run launches, so every actor of
    the run goes there; on a joined one, rank 0's node is known only once it is placed."""
    if join_address(config.cluster.address):
        return None
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    return alive[0] if len(alive) == 1 else None


def start_controller(config: RunConfig, node_id: str | None = None) -> Any:
    """The controller actor, on node_id when given."""
    ctl = config.controller
    if ctl.microbatch_min_samples is None:
        ctl = dataclasses.replace(
            ctl, microbatch_min_samples=config.trainer.microbatch_groups * config.task.group_size)
    where = {} if node_id is None else {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
    return RolloutController.options(num_cpus=0, max_restarts=0, **where).remote(ctl)


def rank_specs(config: RunConfig, weights: Path, reference: Path) -> list[RankSpec]:
    t = config.trainer
    return [RankSpec(rank=r, world_size=t.world_size, checkpoint=str(weights), transfer=config.transfer,
                     reference_checkpoint=str(reference), device=t.device, backend=t.distributed_backend,
                     sharding=t.sharding, optimizer=t.optimizer, grpo=config.grpo,
                     publish_dtype=config.rollout.weights_dtype, impl=config.model.impl,
                     activation_checkpointing=t.activation_checkpointing,
                     max_tokens_per_micro_batch=t.max_tokens_per_micro_batch, packing=t.packing)
            for r in range(t.world_size)]


def instance_template(config: RunConfig, weights: Path, publisher: str) -> InstanceSpec:
    return InstanceSpec(instance_id="template", kind="preemptible", model_dir=str(weights), rollout=config.rollout,
                        transfer=config.transfer, sources=(publisher,))
