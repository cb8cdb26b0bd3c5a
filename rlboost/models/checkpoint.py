"""Hugging Face style checkpoint directories: config.json plus model.safetensors, or shards
listed in model.safetensors.index.json. Also builds seeded tiny checkpoints for tests and
first runs, since no model hub is reachable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlboost.inputs import inside, parse_json, read_json
from rlboost.models.byte_tokenizer import ByteTokenizer
from rlboost.models.config import ModelConfig
from rlboost.models.decoder import DecoderLM
from rlboost.models.layers import RotaryEmbedding

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # some old checkpoints store this buffer
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a config's dtype name ("float32", "float16", "bfloat16")."""
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {name!r}")
    return TORCH_DTYPES[name]


def match_weight_names(model: DecoderLM, names: Iterable[str]
                       ) -> tuple[dict[str, torch.nn.Parameter], list[str], list[str], list[str]]:
    """How HF tensor names fill a model: (parameters by name, names to copy, unknown names,
    parameters no name fills). Names every loader skips are dropped: stored rotary
    buffers, and the lm_head copy of a tied head (HF ignores it too)."""
    params = dict(model.named_parameters())  # a tied lm_head is listed once, as embed_tokens
    tied = model.config.tie_word_embeddings
    use = [n for n in names if not n.endswith(_IGNORED_SUFFIXES) and not (tied and n == "lm_head.weight")]
    unknown = sorted(set(use) - set(params))
    missing = sorted(set(params) - set(use))
    return params, use, unknown, missing


def checkpoint_files(directory: str | Path) -> dict[str, list[str]]:
    """Map each safetensors file of a checkpoint to the tensor names it holds."""
    root = Path(directory)
    index = root / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files: dict[str, list[str]] = {}
        for name, fname in weight_map.items():
            files.setdefault(fname, []).append(name)
        return files
    if (root / SINGLE_FILE).is_file():
        with safe_open(root / SINGLE_FILE, framework="pt") as f:
            return {SINGLE_FILE: list(f.keys())}
    raise FileNotFoundError(f"{directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def verify_checkpoint_dir(directory: str | Path) -> None:
    """Check a checkpoint directory without loading it: config.json parses and every
    safetensors file is whole (its header parses and the file holds every byte the header
    names). Cheap (headers only), so runs check before starting any process.

    Raises FileNotFoundError or ValueError saying which file is wrong and how.
    """
    root = Path(directory)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"{root} holds no config.json (not a model checkpoint directory)")
    try:
        read_json(root / "config.json")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{root / 'config.json'} is not valid JSON ({exc})") from None
    index = root / INDEX_FILE
    if index.is_file():
        try:
            names = sorted(set(read_json(index)["weight_map"].values()))
            for name in names:
                inside(root, name)  # a shard listed as ../elsewhere is refused, never looked at
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"{index} is not a valid safetensors index ({exc})") from None
    elif (root / SINGLE_FILE).is_file():
        names = [SINGLE_FILE]
    else:
        raise FileNotFoundError(f"{root} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    for name in names:
        verify_safetensors(root / name)


def verify_safetensors(path: str | Path) -> None:
    """ValueError unless `path` is a whole safetensors file: an 8-byte little-endian header
    length, a JSON header, and exactly the data bytes its tensors' offsets cover."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if n < 2 or 8 + n > size or n > MAX_HEADER_BYTES:
            raise ValueError(f"{path} is truncated or not a safetensors file ({size} bytes)")
        try:
            header = parse_json(f.read(n), f"{path}'s header")
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                      default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"{path} has a damaged header ({exc!r})") from None
    if size < 8 + n + end:
        raise ValueError(f"{path} is truncated: {size} of {8 + n + end} bytes")
    if size > 8 + n + end:
        raise ValueError(f"{path} has {size - 8 - n - end} bytes after its last tensor")


def empty_model(config: ModelConfig, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> DecoderLM:
    """A DecoderLM with uninitialised parameters (no time spent on random init), allocated
    once, directly in `dtype` on `device`."""
    with torch.device("meta"):
        model = DecoderLM(config).to(dtype=dtype)  # the cast is free on meta tensors
    model.to_empty(device=device)
    if config.tie_word_embeddings:  # to_empty re-creates parameters, which unties them
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = RotaryEmbedding(config)  # built under meta above
    return model


def load_pretrained(directory: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> DecoderLM:
    """Load config.json and the safetensors weights of `directory` into a DecoderLM."""
    config = ModelConfig.load(directory)
    model = empty_model(config, dtype=dtype, device=device)
    files = checkpoint_files(directory)
    params, _, unknown, _ = match_weight_names(model, [n for names in files.values() for n in names])
    if unknown:
        raise ValueError(f"{directory}: unexpected tensors {unknown[:8]} for {config.arch}")
    seen: set[str] = set()
    for fname, names in files.items():
        with safe_open(Path(directory) / fname, framework="pt", device=str(device)) as f:
            for name in match_weight_names(model, names)[1]:
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(params[name].shape):
                    raise ValueError(f"{directory}: {name} has shape {tuple(tensor.shape)}, "
                                     f"expected {tuple(params[name].shape)}")
                with torch.no_grad():
                    params[name].copy_(tensor)
                seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ValueError(f"{directory}: missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    return model


def save_pretrained(model: DecoderLM, directory: str | Path, *, max_shard_bytes: int | None = None,
                    dtype: torch.dtype | None = None, tokenizer: ByteTokenizer | None = None) -> Path:
    """Write config.json and the weights (one file, or shards plus an index when they
    exceed max_shard_bytes); a tied lm_head is left out as HF does.

    The checkpoint is written into a temporary sibling directory (other files already in
    `directory` are carried over) that then takes the place of `directory`, so a crash
    mid-save leaves the previous checkpoint whole.
    """
    root = Path(directory)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.saving-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_checkpoint(model, tmp, max_shard_bytes, dtype, tokenizer)
        _carry_over(root, tmp)
        _swap_into_place(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def _write_checkpoint(model: DecoderLM, root: Path, max_shard_bytes: int | None, dtype: torch.dtype | None,
                      tokenizer: ByteTokenizer | None) -> None:
    tensors = {name: t.detach().to(device="cpu", dtype=dtype or t.dtype).contiguous()
               for name, t in model.named_weights().items()}
    shards = _split_shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], str(root / SINGLE_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(root / fname), metadata={"format": "pt"})
            weight_map.update({name: fname for name in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (root / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    stored_dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    dataclasses.replace(model.config, extra={**model.config.extra, "torch_dtype": stored_dtype}).save(root)
    # safetensors writes its files 0600 (a temporary file renamed into place): give them the
    # mode every other file of the checkpoint gets from the umask
    mode = stat.S_IMODE((root / "config.json").stat().st_mode)
    for shard in root.glob("model*.safetensors"):
        os.chmod(shard, mode)
    if tokenizer is not None:
        tokenizer.save(root)


def _is_checkpoint_file(name: str) -> bool:
    return name == INDEX_FILE or name == "config.json" or (name.startswith("model") and name.endswith(".safetensors"))


def _carry_over(old: Path, new: Path) -> None:
    """Files of `old` that the new checkpoint does not replace (a README, a chat template...)."""
    if not old.is_dir():
        return
    for entry in old.iterdir():
        if _is_checkpoint_file(entry.name) or (new / entry.name).exists():
            continue
        if entry.is_dir():
            shutil.copytree(entry, new / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, new / entry.name, follow_symlinks=False)


def _swap_into_place(tmp: Path, root: Path) -> None:
    for path in tmp.iterdir():  # the data is on disk before any rename can expose it
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    if not root.exists():
        os.replace(tmp, root)
        return
    old = root.parent / f".{root.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(root, old)  # two renames: only between them is `root` absent (both copies exist)
    os.replace(tmp, root)
    shutil.rmtree(old, ignore_errors=True)


def _split_shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int | None):
    if max_shard_bytes is not None and max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def tiny_config(arch: str = "qwen3", *, vocab_size: int = 320, hidden_size: int = 64,
                intermediate_size: int = 128, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2, head_dim: int = 16, tie_word_embeddings: bool | None = None,
                rope_theta: float = 10000.0, max_position_embeddings: int = 4096) -> ModelConfig:
    """A small config of the given family (Qwen2 with q/k/v biases, Qwen3 with q/k norms)."""
    tok = ByteTokenizer()
    if vocab_size < tok.vocab_size:
        raise ValueError(f"vocab_size must be >= {tok.vocab_size} (the byte tokenizer), got {vocab_size}")
    return ModelConfig(
        arch=arch, vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, rope_theta=rope_theta, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=(arch == "qwen3") if tie_word_embeddings is None else tie_word_embeddings,
        qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", bos_token_id=tok.bos_id, eos_token_id=tok.eos_id)


def init_random(model: DecoderLM, seed: int) -> DecoderLM:
    """Seeded weights with O(1) logits, so sampling is neither uniform nor one-hot."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                values = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
            elif name.endswith(".bias"):
                values = 0.1 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name or name == "lm_head.weight":
                values = 0.35 * torch.randn(p.shape, generator=gen)
            else:
                values = torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5
            p.copy_(values)
    return model


def build_tiny_checkpoint(directory: str | Path, arch: str = "qwen3", seed: int = 0, *,
                          max_shard_bytes: int | None = None, **config_overrides) -> Path:
    """Write a seeded tiny checkpoint (config, weights, byte tokenizer) and return its path.

    config_overrides go to `tiny_config` (e.g. num_layers=2, hidden_size=64, vocab_size=320).
    """
    config = tiny_config(arch, **config_overrides)
    model = init_random(empty_model(config), seed)
    return save_pretrained(model, directory, max_shard_bytes=max_shard_bytes, tokenizer=ByteTokenizer())
