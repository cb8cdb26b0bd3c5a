"""RolloutConfig: the rollout engines of a run (one per instance), holding each engine's own
config whole; `backend` picks the one the factory builds (rollout.factory)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.rollout.embedded.config import EmbeddedEngineConfig
from rlboost.rollout.emulated.config import EmulatedEngineConfig
from rlboost.rollout.sglang.config import SGLangEngineConfig
from rlboost.rollout.vllm.config import VLLMEngineConfig
from rlboost.validate import require

BACKENDS = ("embedded", "sglang", "vllm", "emulated")


@dataclass(kw_only=True, slots=True)
class RolloutConfig:
    """The engines and what each instance asks for.

    backend "embedded" is rlboost's torch engine (`embedded`); "sglang" runs SGLang's
    offline engine (`sglang`; needs `pip install 'rlboost[sglang]'` and GPUs); "vllm" runs
    vLLM's AsyncLLM (`vllm`; needs `pip install 'rlboost[vllm]'` and GPUs, or with
    vllm.device=cpu a CPU build of vLLM and no GPU); "emulated"
    takes the time the GPU described by `emulated` would and emits hash tokens, while weight
    pulls, the controller, migrations, preemptions and the trainer stay real.

    >>> RolloutConfig(backend="sglang", instance_gpus=2, sglang=SGLangEngineConfig(tp_size=2)).engine.tp_size
    2
    """

    backend: str = "embedded"
    """which engine every instance runs: embedded, sglang, vllm or emulated"""
    capacity: int = 64
    """samples one instance decodes at once"""
    instance_cpus: float = 0.0
    """CPUs each instance asks Ray for"""
    instance_gpus: float = 0.0
    """GPUs each instance asks Ray for (an SGLang or vLLM engine needs its tp_size)"""
    pull_timeout_s: float = 600.0
    """an instance gives up a weight pull after this long (and tries again)"""
    embedded: EmbeddedEngineConfig = field(default_factory=EmbeddedEngineConfig)
    sglang: SGLangEngineConfig = field(default_factory=SGLangEngineConfig)
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)
    emulated: EmulatedEngineConfig = field(default_factory=EmulatedEngineConfig)

    def __post_init__(self) -> None:
        require(self.backend in BACKENDS, "backend", f"one of {BACKENDS}", self.backend)
        require(self.capacity >= 1, "capacity", ">= 1", self.capacity)
        require(self.instance_cpus >= 0 and self.instance_gpus >= 0, "instance_cpus/instance_gpus", ">= 0",
                (self.instance_cpus, self.instance_gpus))
        require(self.pull_timeout_s > 0, "pull_timeout_s", "> 0", self.pull_timeout_s)
        if self.backend == "sglang":
            require(self.instance_gpus >= self.sglang.tp_size, "instance_gpus",
                    f">= sglang.tp_size ({self.sglang.tp_size}): each SGLang engine spans tp_size GPUs",
                    self.instance_gpus)
        elif self.backend == "vllm":
            if self.vllm.device == "cuda":  # on CPU an engine spans no GPU
                require(self.instance_gpus >= self.vllm.tp_size, "instance_gpus",
                        f">= vllm.tp_size ({self.vllm.tp_size}): each vLLM engine spans tp_size GPUs",
                        self.instance_gpus)
        elif self.backend == "embedded":
            require(self.capacity <= self.embedded.max_batch_size, "capacity",
                    f"<= embedded.max_batch_size ({self.embedded.max_batch_size})", self.capacity)
        else:
            require(self.capacity <= self.emulated.max_running, "capacity",
                    f"<= emulated.max_running ({self.emulated.max_running})", self.capacity)

    @property
    def engine(self) -> EmbeddedEngineConfig | SGLangEngineConfig | VLLMEngineConfig | EmulatedEngineConfig:
        """The config of the selected backend's engine."""
        return {"embedded": self.embedded, "sglang": self.sglang, "vllm": self.vllm,
                "emulated": self.emulated}[self.backend]

    @property
    def weights_dtype(self) -> str:
        """The dtype the trainer publishes weights in for these engines."""
        if self.backend in ("sglang", "vllm"):
            dtype = self.engine.dtype
            return dtype if dtype != "auto" else "bfloat16"
        return self.embedded.dtype

    @property
    def on_gpu(self) -> bool:
        return (self.backend == "sglang" or (self.backend == "vllm" and self.vllm.device == "cuda")
                or (self.backend == "embedded" and self.embedded.device != "cpu"))
