"""ModelConfig: the shape of a Llama / Qwen2 / Qwen3 decoder, read from and written to an
HF-style config.json so that real checkpoints and our own tiny ones load the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
ROPE_TYPES = ("default", "linear", "llama3")
# keys each scaling scheme reads from rope_scaling (all positive numbers)
ROPE_KEYS = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Architecture hyper-parameters of one decoder-only model.

    >>> c = ModelConfig(arch="qwen3", vocab_size=320, hidden_size=64, intermediate_size=128,
    ...                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    >>> c.qk_norm, c.qkv_bias, c.num_query_groups
    (True, False, 2)

    `qkv_bias` (Qwen2, or Llama/Qwen3 with attention_bias) adds biases to q/k/v; `o_bias`
    to the output projection (attention_bias of Llama/Qwen3); `qk_norm` (Qwen3) applies an
    RMSNorm per head to queries and keys before RoPE. `rope_scaling` holds HF's
    rope_scaling/rope_parameters dict for the "linear" and "llama3" schemes.
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # other config.json keys, kept on save

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {self.arch!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"rope_theta must be a positive finite number, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        self._check_rope_scaling()

    def _check_rope_scaling(self) -> None:
        rope_type = self.rope_type
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_scaling type must be one of {ROPE_TYPES}, got {rope_type!r}")
        s = self.rope_scaling or {}
        for key in ROPE_KEYS.get(rope_type, ()):
            value = s.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"rope_scaling[{key!r}] must be a positive number for rope_type "
                                 f"{rope_type!r}, got {value!r}")
        if rope_type == "llama3" and not s["low_freq_factor"] < s["high_freq_factor"]:
            raise ValueError(f"rope_scaling: low_freq_factor ({s['low_freq_factor']}) must be below "
                             f"high_freq_factor ({s['high_freq_factor']}) for rope_type 'llama3'")

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        return str(self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")))

    @property
    def num_query_groups(self) -> int:
        """Query heads per key/value head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face config.json dict (transformers 4.x or 5.x layout)."""
        arch = hf.get("model_type")
        if arch not in ARCHITECTURES:
            raise ValueError(f"model_type must be one of {sorted(ARCHITECTURES)}, got {arch!r}")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act must be 'silu' (SwiGLU), got {act!r}")
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported (full attention only)")
        heads = int(hf["num_attention_heads"])
        rope = dict(hf.get("rope_parameters") or {})
        theta = float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)))
        scaling = hf.get("rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
            scaling = None
        attention_bias = bool(hf.get("attention_bias", False))
        known = {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
                 "rope_parameters", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                 "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "architectures", "hidden_act"}
        return cls(
            arch=arch, vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
            rope_theta=theta, rope_scaling=dict(scaling) if scaling else None,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or attention_bias,
            o_bias=arch != "qwen2" and attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)), qk_norm=arch == "qwen3",
            bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
            extra={k: v for k, v in hf.items() if k not in known})

    def to_hf_config(self) -> dict[str, Any]:
        """The config.json dict (readable by transformers 4.x and 5.x)."""
        if self.arch == "qwen2" and not (self.qkv_bias and not self.o_bias):
            raise ValueError("qwen2 always has q/k/v biases and no output bias")
        if self.arch != "qwen2" and self.qkv_bias != self.o_bias:
            raise ValueError(f"{self.arch} biases q/k/v/o together (attention_bias)")
        if (self.arch == "qwen3") != self.qk_norm:
            raise ValueError("qk_norm is on for qwen3 and off otherwise")
        out: dict[str, Any] = dict(self.extra)
        rope_parameters = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling:
            rope_parameters.update(self.rope_scaling)
        out.update({
            "architectures": [ARCHITECTURES[self.arch]], "model_type": self.arch,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "hidden_act": "silu", "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
            "rope_parameters": rope_parameters, "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.o_bias if self.arch != "qwen2" else False,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
        })
        if self.arch == "llama":
            out["mlp_bias"] = self.mlp_bias
        elif self.mlp_bias:
            raise ValueError(f"{self.arch} has no mlp_bias")
        return out

    @classmethod
    def load(cls, directory: str | Path) -> ModelConfig:
        path = Path(directory) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {directory}")
        return cls.from_hf_config(json.loads(path.read_text()))

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_hf_config(), indent=2, sort_keys=True) + "\n")
        return path

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
