"""paper_qwen3_8b: the RLBoost artifact's setup at its real proportions, emulated (and the
paper's setup for any of its models, PaperModel, which paper_qwen3_14b_32b uses).

Qwen3-8B GRPO, 128 prompts x 8 samples with responses up to 14,336 tokens (a long-tailed
log-normal), on one reserved 8x H100 node (the trainer's 8 GPUs, rolling out as four TP-2
engines during the local window) and up to four preemptible instances, each a quarter of
an 8x H100 spot node (one TP-2 engine, billed a quarter of $21.28/h). Engines and the
trainer take rlboost.timing's time; each emulated token stands for TOKEN_BLOCK real ones,
and one factor, TIME_SCALE, divides every duration (decode, prefill, training, start-up,
notices, the trace, controller constants, weight pulls through the egress cap and a
scaled payload), so a run's minute is TIME_SCALE minutes of the modelled cluster.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.cost import CostConfig
from rlboost.config.run import RunConfig, RunOptions
from rlboost.controller.config import ControllerConfig, WindowConfig
from rlboost.controller.offload import AdaptiveWindowConfig, ReferenceWindowConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.controller.router import RouterConfig
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.rollout.emulated.lengths import LengthConfig
from rlboost.tasks.config import TaskConfig
from rlboost.timing import gpu_timing, model_shape, startup_s
from rlboost.trainer.config import TrainerConfig
from rlboost.trainer.starting_weights import ModelSource
from rlboost.transfer.config import ServerConfig, TransferConfig

TIME_SCALE = 25.0       # modelled seconds per second of the run
TOKEN_BLOCK = 64        # real tokens per emulated token
PROMPT_TOKENS = 5       # the arithmetic prompts' length in emulated tokens (320 real tokens)
MAX_RESPONSE = 14_336   # the artifact's response cap, real tokens
ENGINE_GPUS = 2         # TP-2 engines: four on the reserved node, one per preemptible instance
NODE_GPUS = 8
CAPACITY = 256          # samples one engine decodes at once
ON_DEMAND_NODE_USD_H = 83.79
SPOT_NODE_USD_H = 21.28
EGRESS_BYTES_PER_S = 1_500_000_000
# GPU memory an engine holds: SGLang's default static share on an 80 GB GPU on a dedicated
# preemptible instance; the artifact's colocated rollout on the trainer's GPUs uses 0.6
# (PolyRL run_async_grpo8b_pipeline.sh, gpu_memory_utilization), and so do its standalone
# workers (launch_sglang_step.sh, --mem-fraction-static 0.6: "0.9 causes OOM").
SGLANG_MEMORY_FRACTION = 0.85
COLOCATED_MEMORY_FRACTION = 0.6
ARTIFACT_WORKER_MEMORY_FRACTION = 0.6
# What the colocated trainer keeps on each GPU while its engines roll out, as the artifact's
# verl run configures it (param_offload=False, optimizer_offload=True, use_kl_loss): the actor's
# fp32 parameters (4 bytes each) and the reference model's bf16 ones (2 bytes), each sharded
# over the node's 8 GPUs; gradients are freed after the step and the optimizer lives in CPU
# memory. SGLang sizes its KV pool from what is left (mem_fraction_static of the GPU, less
# what is already resident), so the colocated engines hold less KV than a whole-GPU worker.
COLOCATED_TRAINER_BYTES_PER_PARAM = 4 + 2
# A simulated controller's round at hundreds of instances: 5 modelled seconds (the real loop's
# poll interval, 0.05 s of the run, is 1.25 s; a round there costs O(instances)).
CONTROLLER_ROUND_S = 0.2
# The published rule's per-instance-count windows for an 8B model (PolyRL balance.rs), seconds.
REFERENCE_8B_OPTIMA = ((1, 190.0), (2, 160.0), (3, 105.0), (4, 70.0))


@dataclass(frozen=True, slots=True)
class PaperModel:
    """One of the paper's models in its setup: the timing model's name, the reserved cluster's
    8x H100 on-demand nodes (the trainer on all their GPUs, rolling out in the local window as
    engines of reserved_engine_gpus each), and the published rule's per-count windows."""

    recipe: str
    model: str
    trainer_nodes: int = 1
    reserved_engine_gpus: int = ENGINE_GPUS
    seeded_optima: tuple[tuple[int, float], ...] = ()

    @property
    def trainer_gpus(self) -> int:
        return self.trainer_nodes * NODE_GPUS


QWEN3_8B = PaperModel("paper_qwen3_8b", "qwen3-8b", seeded_optima=REFERENCE_8B_OPTIMA)


def _run_s(cluster_s: float) -> float:
    """A duration of the modelled cluster in the run's seconds."""
    return cluster_s / TIME_SCALE


def _rate(real_tokens_per_s: float) -> float:
    """A rate of the modelled cluster in emulated tokens per second of the run."""
    return real_tokens_per_s * TIME_SCALE / TOKEN_BLOCK


def paper_engine(pm: PaperModel = QWEN3_8B) -> EmulatedEngineConfig:
    resident = COLOCATED_TRAINER_BYTES_PER_PARAM * model_shape(pm.model).params / pm.trainer_gpus
    return EmulatedEngineConfig(model=pm.model, accelerator="h100-sxm", gpus=ENGINE_GPUS,
                                reserved_gpus=pm.reserved_engine_gpus, max_running=CAPACITY,
                                token_block=TOKEN_BLOCK, time_scale=TIME_SCALE, startup_s=startup_s(),
                                memory_fraction=SGLANG_MEMORY_FRACTION,
                                reserved_memory_fraction=COLOCATED_MEMORY_FRACTION, reserved_resident_bytes=resident,
                                lengths=LengthConfig(kind="lognormal"))


def _full_batch_rate(model: str, gpus: int) -> float:
    """Tokens/s of an engine decoding a full batch mid-step (2,000 cached tokens a sample)."""
    return CAPACITY / gpu_timing(model, "h100-sxm", gpus).decode_step_s(CAPACITY, CAPACITY * 2_000.0)


def paper_controller(pm: PaperModel = QWEN3_8B) -> ControllerConfig:
    """The controller at the modelled cluster's time constants, and rate priors from the timing model."""
    engine = gpu_timing(pm.model, "h100-sxm", ENGINE_GPUS)
    alone = 1.0 / engine.decode_step_s(1, 2_000.0)
    prefill = 4_096 / engine.prefill_s(4_096)
    return ControllerConfig(
        poll_interval_s=0.05, idle_timeout_s=120.0, call_timeout_s=30.0,
        reserved_tokens_per_s=_rate(_full_batch_rate(pm.model, pm.reserved_engine_gpus)),
        preemptible_tokens_per_s=_rate(_full_batch_rate(pm.model, ENGINE_GPUS)), sample_tokens_per_s=_rate(alone),
        registry=RegistryConfig(heartbeat_interval_s=0.5, missed_beats=6, drain_margin_s=_run_s(10.0)),
        router=RouterConfig(min_steal_gain_s=_run_s(10.0), prefill_tokens_per_s=_rate(prefill)),
        window=WindowConfig(
            policy="adaptive",
            adaptive=AdaptiveWindowConfig(initial_window_s=_run_s(150.0), idle_target_s=_run_s(2.0)),
            reference=ReferenceWindowConfig(initial_window_s=_run_s(150.0), floor_s=_run_s(5.0),
                                            unit_s=_run_s(1.0), seeded_optima=pm.seeded_optima)))


def paper_recipe(pm: PaperModel) -> RunConfig:
    """The paper's setup for the model: 128 prompts x 8 samples, responses up to 14,336 tokens,
    the trainer on the reserved nodes, four preemptible TP-2 instances (a quarter of an 8x H100
    spot node each)."""
    return RunConfig(
        model=ModelSource(source="tiny", warmup_steps=0),
        task=TaskConfig(name="arithmetic", groups_per_step=128, group_size=8,
                        max_new_tokens=MAX_RESPONSE // TOKEN_BLOCK),
        trainer=TrainerConfig(world_size=pm.trainer_gpus, microbatch_groups=2),
        controller=paper_controller(pm),
        rollout=RolloutConfig(backend="emulated", capacity=CAPACITY, emulated=paper_engine(pm)),
        transfer=TransferConfig(publisher=ServerConfig(egress_bytes_per_s=EGRESS_BYTES_PER_S)),
        cluster=ClusterConfig(reserved_instances=pm.trainer_gpus // pm.reserved_engine_gpus, max_preemptible=4,
                              initial_preemptible=4, trace="none", sudden_fraction=0.0),
        cost=CostConfig(reserved_usd_per_hour=ON_DEMAND_NODE_USD_H * pm.trainer_nodes,
                        preemptible_usd_per_hour=SPOT_NODE_USD_H * ENGINE_GPUS / NODE_GPUS, time_scale=TIME_SCALE),
        run=RunOptions(name=pm.recipe, steps=10, checkpoint_every=1000, microbatch_timeout_s=600.0),
    )


def paper_qwen3_8b() -> RunConfig:
    return paper_recipe(QWEN3_8B)


def with_reference_mechanisms(config: RunConfig) -> RunConfig:
    """The same run with the published system's mechanisms in place of rlboost's: the window
    moved by a third of the idle-time gap (with its 8B per-count memory), one request per
    prompt group sent round-robin to instances with room and never moved once placed (no
    work stealing), a migrated group trimmed to its shortest member, weights pushed by the
    trainer alone (no relays), and no use of preemption notices (it learns of a preemption
    when the instance's stream breaks, PolyRL handlers.rs; reference-implementation.md
    section 9, item 11): every preemption reaches it as a sudden death at the same moment."""
    router = dataclasses.replace(config.controller.router, dispatch="group_round_robin", max_moves_per_tick=0)
    controller = dataclasses.replace(
        config.controller, continuation="trim_group", router=router,
        window=dataclasses.replace(config.controller.window, policy="reference"))
    return dataclasses.replace(config, controller=controller,
                               transfer=dataclasses.replace(config.transfer, relay=False),
                               cluster=dataclasses.replace(config.cluster, sudden_fraction=1.0))


def artifact_setup(config: RunConfig) -> RunConfig:
    """The published system as its artifact ran it: its mechanisms (with_reference_mechanisms) on
    standalone workers that hold 0.6 of their GPUs' memory, as launch_sglang_step.sh starts them."""
    config = with_reference_mechanisms(config)
    emulated = dataclasses.replace(config.rollout.emulated, memory_fraction=ARTIFACT_WORKER_MEMORY_FRACTION)
    return dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, emulated=emulated))


# The artifact's measured throughput with 1, 2, 3 and 4 workers, tokens/s (prompt + response,
# each read over a 30-minute phase; PolyRL REPRODUCE.md), over verl's 1,300 x 8 baseline.
ARTIFACT_MEASURED_TOKENS_PER_S = {0: 10_400.0, 1: 12_000.0, 2: 14_000.0, 3: 16_000.0, 4: 18_000.0}


def artifact_workers(config: RunConfig) -> RunConfig:
    """artifact_setup with the artifact's worker schedule (a file trace, at its own pace): a
    worker added every 1800 s up to four, then the oldest killed without notice and relaunched
    1800 s later."""
    from rlboost.cluster.traces.readers import DATA

    cluster = dataclasses.replace(config.cluster, trace=str(DATA / "artifact_worker_schedule.csv"), max_preemptible=4,
                                  initial_preemptible=0, trace_duration_s=None)
    return artifact_setup(dataclasses.replace(config, cluster=cluster))


SPOT_TRACE = "aws-spot-4node"  # the bundled measured trace: 9 hours of 4 AWS spot instances


def on_spot_trace(config: RunConfig, trace: str = SPOT_TRACE) -> RunConfig:
    """The run's preemptible instances following a spot trace, at its own pace (one trace second
    is one modelled second; a file given later with --set cluster.trace=PATH too), with its
    cloud's notices (AWS's two minutes for the bundled one)."""
    cluster = dataclasses.replace(config.cluster, trace=trace, initial_preemptible=0, trace_duration_s=None)
    return dataclasses.replace(config, cluster=cluster)
