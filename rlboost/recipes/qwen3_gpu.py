"""qwen3_gpu: a GPU run in the shape of the RLBoost paper's artifact. A Qwen3-class
checkpoint (HF layout, Qwen3-8B by default) trained with GRPO on a math dataset, responses up
to 14,336 tokens. The reserved cluster is one
8-GPU node: 4 FSDP ranks over NCCL (bfloat16 compute, float32 reductions) and 2 SGLang
engines of 2 GPUs each; up to 4 preemptible SGLang instances of 2 GPUs each (a quarter of
an 8-GPU spot node) follow the bundled trace. Give the checkpoint and the dataset:

    rlboost train --recipe qwen3_gpu --set model.path=/models/Qwen3-1.7B \\
        --set task.math.path=/data/gsm8k/train.parquet

`--set rollout.backend=vllm` rolls out with vLLM (the same shape, 2 GPUs per engine;
`pip install 'rlboost[vllm]'`), and `--set rollout.backend=embedded` with rlboost's own
engine (one GPU each).
The run checks that the Ray cluster has these GPUs before it starts anything. Weight
servers listen on every interface and admit only the run's processes (they share the
run's secret, which Ray hands them).
"""

from __future__ import annotations

from rlboost.cluster.config import ClusterConfig
from rlboost.cluster.cost import CostConfig
from rlboost.config.run import RunConfig, RunOptions
from rlboost.controller.config import ControllerConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.rollout.sglang.config import SGLangEngineConfig
from rlboost.rollout.vllm.config import VLLMEngineConfig
from rlboost.tasks.config import TaskConfig
from rlboost.tasks.dataset import MathDatasetConfig
from rlboost.trainer.config import FSDPConfig, OptimizerConfig, TrainerConfig
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.starting_weights import ModelSource
from rlboost.transfer.config import TransferConfig


def qwen3_gpu() -> RunConfig:
    return RunConfig(
        model=ModelSource(source="path", path="/models/Qwen3-8B", warmup_steps=0),
        task=TaskConfig(name="math", math=MathDatasetConfig(path="/data/gsm8k/train.parquet", answer_format="gsm8k"),
                        prompt_template="{prompt}\nPut the final answer in \\boxed{}.",
                        chat_template=True, answer="extract", groups_per_step=64, group_size=8,
                        max_new_tokens=14336),
        # Qwen3-8B with responses up to 14,336 tokens on 80 GB GPUs: forwards of at most 16,384
        # tokens, layers recomputed in backward, AdamW's state in host memory (`rlboost plan`)
        trainer=TrainerConfig(world_size=4, device="cuda", backend="nccl", rendezvous="tcp", microbatch_groups=8,
                              max_tokens_per_micro_batch=16384, activation_checkpointing=True,
                              rank_cpus=1.0, rank_gpus=1.0, optimizer=OptimizerConfig(lr=1e-6, offload=True),
                              sharding=FSDPConfig(param_dtype="bfloat16", reduce_dtype="float32")),
        grpo=GRPOConfig(clip_eps_low=0.2, clip_eps_high=0.28),
        controller=ControllerConfig(
            migrate_with_kv=True,
            poll_interval_s=0.05, idle_timeout_s=600.0, call_timeout_s=120.0,
            reserved_tokens_per_s=20000.0, preemptible_tokens_per_s=20000.0, sample_tokens_per_s=60.0,
            registry=RegistryConfig(heartbeat_interval_s=2.0, missed_beats=5, drain_margin_s=10.0)),
        rollout=RolloutConfig(backend="sglang", capacity=256, instance_cpus=1.0, instance_gpus=2.0,
                              sglang=SGLangEngineConfig(tp_size=2, mem_fraction_static=0.8, dtype="bfloat16",
                                                        stream_interval=16),
                              vllm=VLLMEngineConfig(tp_size=2, gpu_memory_utilization=0.8, dtype="bfloat16",
                                                    stream_interval=16),
                              embedded=EmbeddedEngineConfig(device="cuda", dtype="bfloat16", num_blocks=16384,
                                                            block_size=16, max_batch_size=256,
                                                            max_prefill_tokens=8192, stream_interval=16)),
        # every node's weight servers listen on all interfaces (peers dial each node's own
        # address); the run's secret keeps out everyone else
        transfer=TransferConfig(bind_host="0.0.0.0", streams=8, chunk_bytes=32 << 20),
        cluster=ClusterConfig(reserved_instances=2, max_preemptible=4, trace="sample",
                              notice_s=30.0, sudden_fraction=0.5),
        # the reserved cluster is one 8x H100 on-demand node (4 ranks + 2 engines of 2 GPUs);
        # a preemptible instance is 2 GPUs: a quarter of an 8x H100 spot node (the paper's prices)
        cost=CostConfig(reserved_usd_per_hour=83.79, preemptible_usd_per_hour=21.28 / 4),
        run=RunOptions(name="qwen3_gpu", steps=200, checkpoint_every=20),
    )
