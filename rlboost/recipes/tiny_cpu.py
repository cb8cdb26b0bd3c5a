"""tiny_cpu: the default recipe. A tiny Qwen3-style model built from scratch and warmed up
on single-digit addition learns it with GRPO on a 2-core CPU in a few minutes, with 2
FSDP ranks, one reserved engine and up to 3 preemptible instances following the bundled
spot trace (compressed to the run), which preempts three of them (notice, sudden, notice).
"""

from __future__ import annotations

from rlboost.cluster.config import ClusterConfig
from rlboost.config.run import RunConfig, RunOptions
from rlboost.controller.config import ControllerConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.tasks.arithmetic import ArithmeticConfig
from rlboost.tasks.config import TaskConfig
from rlboost.trainer.config import OptimizerConfig, TrainerConfig
from rlboost.trainer.starting_weights import ModelSource


def tiny_cpu() -> RunConfig:
    return RunConfig(
        model=ModelSource(source="tiny", arch="qwen3", warmup_steps=40, warmup_batch=64, warmup_lr=3e-3),
        task=TaskConfig(name="arithmetic", arithmetic=ArithmeticConfig(max_operand=9),
                        groups_per_step=64, group_size=8, max_new_tokens=4),
        trainer=TrainerConfig(world_size=2, microbatch_groups=16,
                              optimizer=OptimizerConfig(lr=1e-3, max_grad_norm=1.0)),
        controller=ControllerConfig(
            migrate_with_kv=True,
            poll_interval_s=0.05, idle_timeout_s=120.0, call_timeout_s=30.0,
            registry=RegistryConfig(heartbeat_interval_s=1.0, missed_beats=5, drain_margin_s=8.0)),
        rollout=RolloutConfig(embedded=EmbeddedEngineConfig(num_blocks=256, block_size=16, max_batch_size=64,
                                                            max_prefill_tokens=512, stream_interval=4),
                              capacity=64),
        cluster=ClusterConfig(reserved_instances=1, max_preemptible=3, trace="sample", trace_fraction=0.6,
                              notice_s=8.0, sudden_fraction=0.5, preempt_busy_wait_s=5.0),
        run=RunOptions(name="tiny_cpu", steps=60, checkpoint_every=20),
    )
