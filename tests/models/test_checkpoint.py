"""Checkpoint directories: HF names, bytes-exact round trips, shards, tied heads, bad files."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlboost.models import (
    ByteTokenizer,
    ModelConfig,
    build_tiny_checkpoint,
    checkpoint_files,
    load_pretrained,
    save_pretrained,
)

ARCHS = ["llama", "qwen2", "qwen3"]


def read_tensors(directory) -> dict[str, torch.Tensor]:
    out = {}
    for fname, names in checkpoint_files(directory).items():
        with safe_open(directory / fname, framework="pt") as f:
            out.update({n: f.get_tensor(n) for n in names})
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_is_bytes_exact(tmp_path, arch):
    src = build_tiny_checkpoint(tmp_path / "a", arch=arch, seed=3)
    model = load_pretrained(src)
    dst = save_pretrained(model, tmp_path / "b")
    a, b = read_tensors(src), read_tensors(dst)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype
        assert a[name].view(torch.uint8).equal(b[name].view(torch.uint8)), name
    assert ModelConfig.load(dst) == ModelConfig.load(src)


@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_names_are_hugging_faces(tmp_path, arch):
    names = set(read_tensors(build_tiny_checkpoint(tmp_path, arch=arch, num_layers=1)))
    attn = "model.layers.0.self_attn."
    expected = {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight",
                "model.layers.0.post_attention_layernorm.weight", *(f"{attn}{p}_proj.weight" for p in "qkvo"),
                *(f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}
    if arch == "qwen2":
        expected |= {f"{attn}{p}_proj.bias" for p in "qkv"}
    if arch == "qwen3":
        expected |= {f"{attn}q_norm.weight", f"{attn}k_norm.weight"}
    else:
        expected |= {"lm_head.weight"}  # qwen3 tiny checkpoints tie the head to the embeddings
    assert names == expected


def test_tied_head_is_the_embedding(tmp_path):
    model = load_pretrained(build_tiny_checkpoint(tmp_path, arch="qwen3"))
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" in model.state_dict()  # the trainer may send both names


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    single = build_tiny_checkpoint(tmp_path / "one", arch="llama", seed=5)
    sharded = build_tiny_checkpoint(tmp_path / "many", arch="llama", seed=5, max_shard_bytes=40_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (sharded / "model.safetensors").exists()
    a, b = load_pretrained(single).state_dict(), load_pretrained(sharded).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    # re-saving as one file removes the shards, so the directory stays unambiguous
    save_pretrained(load_pretrained(sharded), sharded)
    assert not (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("model*.safetensors"))) == 1


def test_bfloat16_load_and_save(tmp_path):
    src = build_tiny_checkpoint(tmp_path / "a", arch="qwen2")
    model = load_pretrained(src, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    dst = save_pretrained(model, tmp_path / "b")
    assert json.loads((dst / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert model(torch.tensor([[1, 2, 3]])).dtype == torch.bfloat16


def _rewrite(directory, fn):
    path = directory / "model.safetensors"
    tensors = read_tensors(directory)
    fn(tensors)
    save_file(tensors, str(path))


@pytest.mark.parametrize("damage, message", [
    (lambda t: t.pop("model.norm.weight"), "missing"),
    (lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}), "unexpected"),
    (lambda t: t.update({"model.norm.weight": torch.zeros(3)}), "shape"),
])
def test_damaged_checkpoint_is_refused_with_the_tensor_named(tmp_path, damage, message):
    ckpt = build_tiny_checkpoint(tmp_path, arch="llama")
    _rewrite(ckpt, damage)
    with pytest.raises(ValueError, match=message):
        load_pretrained(ckpt)


def test_missing_files_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_pretrained(tmp_path)
    build_tiny_checkpoint(tmp_path, arch="llama")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError):
        load_pretrained(tmp_path)


def test_tiny_checkpoint_is_seeded(tmp_path):
    a = read_tensors(build_tiny_checkpoint(tmp_path / "a", seed=1))
    b = read_tensors(build_tiny_checkpoint(tmp_path / "b", seed=1))
    c = read_tensors(build_tiny_checkpoint(tmp_path / "c", seed=2))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_checkpoint_directory_is_self_describing(tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path, arch="qwen3", vocab_size=288)
    tok = ByteTokenizer.load(ckpt)
    config = ModelConfig.load(ckpt)
    assert tok.vocab_size <= config.vocab_size == 288
    assert config.eos_token_ids == (tok.eos_id,) and config.bos_token_id == tok.bos_id
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_checkpoint(tmp_path / "small", vocab_size=100)


def test_a_crash_mid_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    from rlboost.models import checkpoint

    root = build_tiny_checkpoint(tmp_path / "ckpt", arch="llama", seed=1, max_shard_bytes=40_000)
    (root / "README.md").write_text("kept\n")
    before = read_tensors(root)
    newer = load_pretrained(build_tiny_checkpoint(tmp_path / "newer", arch="llama", seed=2))
    real_save, calls = checkpoint.save_file, []

    def crash_on_second_shard(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise OSError("disk full")
        real_save(*args, **kwargs)
    monkeypatch.setattr(checkpoint, "save_file", crash_on_second_shard)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(newer, root, max_shard_bytes=40_000)
    after = read_tensors(root)
    assert after.keys() == before.keys() and all(torch.equal(after[n], before[n]) for n in before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "newer"]  # no half-written leftovers
    monkeypatch.setattr(checkpoint, "save_file", real_save)
    save_pretrained(newer, root)
    assert (root / "README.md").read_text() == "kept\n"  # files the checkpoint does not own survive
    assert load_pretrained(root).state_dict().keys() == newer.state_dict().keys()
    assert torch.equal(load_pretrained(root).model.norm.weight, newer.model.norm.weight)


def test_empty_model_allocates_parameters_directly_in_the_asked_dtype():
    from torch.utils._python_dispatch import TorchDispatchMode

    from rlboost.models import empty_model, tiny_config

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.float32_elements = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == torch.float32:
                    self.float32_elements += t.numel()
            return out

    config = tiny_config("llama", vocab_size=4096, hidden_size=128)
    with Allocations() as seen:
        model = empty_model(config, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    # only the rotary table (head_dim / 2 floats) may be float32, never a parameter-sized tensor
    assert seen.float32_elements < 4096


def test_weights_are_written_with_the_mode_of_every_other_file(tmp_path):
    import stat

    from rlboost.models.checkpoint import build_tiny_checkpoint

    root = build_tiny_checkpoint(tmp_path / "m", hidden_size=16, intermediate_size=32, num_layers=1,
                                 num_heads=2, num_kv_heads=1, head_dim=8)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in root.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == modes["config.json"], modes
