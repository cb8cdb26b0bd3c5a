"""The trainer's memory plan for a whole run config: the model's shape (its config.json, or
a known model by name when the checkpoint is not on this machine), the tokens of one
forward, the trainer's switches and the GPU kind. `rlboost plan` prints it; a GPU run
whose plan does not fit is refused before anything starts, in one line. An emulated run
(its trainer takes the time of a named model on named GPUs) is planned as the trainer it
emulates would need, and says so.
"""

from __future__ import annotations

from pathlib import Path

from rlboost.config.run import RunConfig
from rlboost.errors import ConfigError
from rlboost.models.hf import embedded_refusal, read_hf_config, served_by_rlboost
from rlboost.timing import accelerator
from rlboost.trainer.emulated import emulates_trainer
from rlboost.trainer.memory import KNOWN_MODELS, MemoryPlan, ModelDims, plan_trainer_memory, tokens_per_forward

# Prompt tokens a plan assumes (templates included) when the task does not bound them.
PROMPT_TOKENS = 1024
TINY_VOCAB = 320  # models.tiny_config's vocabulary


def model_dims(config: RunConfig) -> ModelDims:
    """The trained model's shape, without loading it (of an emulated run: the model whose
    time its trainer takes, when it is one the plan knows)."""
    emulated = _emulated_model(config)
    if emulated is not None:
        return emulated
    m = config.model
    if m.source == "tiny":
        return ModelDims(f"tiny-{m.arch}", TINY_VOCAB, m.hidden_size, m.intermediate_size, m.num_layers,
                         m.num_heads, m.num_kv_heads, m.head_dim, tied=m.arch == "qwen3",
                         qk_norm=m.arch == "qwen3")
    if m.source == "smollm2":
        return KNOWN_MODELS["smollm2-135m"]
    path = Path(m.path).expanduser()
    if (path / "config.json").is_file():
        return ModelDims.from_hf_config(read_hf_config(path), name=path.name)
    known = KNOWN_MODELS.get(path.name.lower())
    if known is None:
        raise FileNotFoundError(f"model.path {path} holds no config.json, and its name is none of the models the "
                                f"plan knows by name ({', '.join(sorted(KNOWN_MODELS))})")
    return known


def _emulated_model(config: RunConfig) -> ModelDims | None:
    return KNOWN_MODELS.get(config.rollout.emulated.model) if emulates_trainer(config.rollout) else None


def run_memory_plan(config: RunConfig, *, gpu: str | None = None, prompt_tokens: int = PROMPT_TOKENS) -> MemoryPlan:
    """Per-rank memory of the run's trainer on `gpu` (default trainer.gpu, or the GPU an
    emulated run models; a CPU run is planned without a capacity)."""
    t, task = config.trainer, config.task
    dims = model_dims(config)
    emulated = _emulated_model(config) is not None
    on_gpu = t.device == "cuda" or gpu is not None or emulated
    gpu = gpu or (config.rollout.emulated.accelerator if emulated else t.gpu)
    block = config.rollout.emulated.token_block if emulated else 1  # real tokens per emulated one
    sample_tokens = prompt_tokens + task.max_new_tokens * block
    per_rank = -(-t.microbatch_groups * task.group_size // t.world_size)
    tokens = tokens_per_forward(max_tokens=t.max_tokens_per_micro_batch, sample_tokens=sample_tokens,
                                samples_per_rank=per_rank)
    compute = _dtype_bytes(t.sharding.param_dtype, 4)
    capacity = accelerator(gpu).memory_bytes if on_gpu else None
    engine, shrink = _colocated_engine(config, dims, capacity)
    # a rank's share at the longest length, cut by the budget: past the first micro-batch the
    # gradient shards are alive through the forward
    micro_batches = -(-per_rank * sample_tokens // tokens) if t.max_tokens_per_micro_batch else 1
    return plan_trainer_memory(dims, world_size=t.world_size, tokens=tokens, compute_bytes=compute,
                               checkpointing=t.activation_checkpointing, offload=t.optimizer.offload,
                               device=gpu if on_gpu else "cpu", capacity_bytes=capacity, cuda=on_gpu,
                               engine_bytes=engine, engine_shrink=shrink, micro_batches=micro_batches,
                               reshard_after_forward=t.sharding.reshard_after_forward,
                               reduce_bytes=_dtype_bytes(t.sharding.reduce_dtype, compute))


def _dtype_bytes(name: str | None, default: int) -> int:
    return {"bfloat16": 2, "float16": 2, "float32": 4}.get(name or "", default)


def _colocated_engine(config: RunConfig, dims: ModelDims, capacity: float | None) -> tuple[float, str]:
    """What a reserved engine takes of a rank's GPU when they share it (trainer.rank_gpus < 1)."""
    r = config.rollout
    if capacity is None or config.trainer.rank_gpus >= 1 or not config.cluster.reserved_instances:
        return 0.0, ""
    if r.backend == "sglang":
        return r.sglang.mem_fraction_static * capacity, "a smaller rollout.sglang.mem_fraction_static"
    if r.backend == "vllm":
        return r.vllm.gpu_memory_utilization * capacity, "a smaller rollout.vllm.gpu_memory_utilization"
    if r.backend == "embedded":
        e = r.embedded
        kv = 2 * dims.layers * dims.kv_width * 2 * e.num_blocks * e.block_size
        return dims.params * 2 + kv, "fewer rollout.embedded.num_blocks"
    return 0.0, ""


def header(config: RunConfig, plan: MemoryPlan, prompt_tokens: int = PROMPT_TOKENS) -> str:
    t = config.trainer
    dims = model_dims(config)
    budget = t.max_tokens_per_micro_batch
    new_tokens = config.task.max_new_tokens
    note = ""
    if _emulated_model(config) is not None:
        e = config.rollout.emulated
        new_tokens *= e.token_block
        note = (f"emulated run (time_scale {e.time_scale:g}: a second of the run is {e.time_scale:g} s of the modelled "
                f"cluster; {e.token_block} real tokens per emulated one): its trainer computes nothing and takes the "
                f"time of a {e.model} trainer on {e.accelerator}; below, the memory that trainer would need\n")
    return note + (
            f"{dims.name} ({dims.params / 1e9:.2f}B parameters), {t.world_size} ranks on {plan.device}: "
            f"{plan.tokens} tokens per forward ({'budget ' + str(budget) if budget else 'no token budget'}; "
            f"samples up to {prompt_tokens} prompt + {new_tokens} new tokens), "
            f"activation checkpointing {'on' if t.activation_checkpointing else 'off'}, "
            f"optimizer offload {'on' if t.optimizer.offload else 'off'}")


def check_memory(config: RunConfig) -> None:
    """ConfigError (one line) when a GPU run's trainer will not fit its GPUs."""
    if config.trainer.device != "cuda":
        return
    try:
        plan = run_memory_plan(config)
    except FileNotFoundError:  # no shape to plan from: the checkpoint check names the file
        return
    if not plan.fits:
        raise ConfigError(plan.refusal())


def check_rollout_architecture(config: RunConfig) -> None:
    """ConfigError (one line) when the embedded engine is asked to serve an architecture
    outside rlboost's decoders."""
    m = config.model
    if config.rollout.backend != "embedded" or m.source != "path":
        return
    path = Path(m.path).expanduser()
    if not (path / "config.json").is_file():
        return  # the checkpoint check names it
    hf = read_hf_config(path)
    if not served_by_rlboost(hf):
        raise ConfigError(embedded_refusal(path, hf))
