"""DecoderLM computes the Llama / Qwen2 / Qwen3 function: against hand-written float64 math,
against Hugging Face's implementation when transformers is installed, and on padded batches."""

import dataclasses
import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from rlboost.models import build_tiny_checkpoint, empty_model, load_pretrained, save_pretrained, tiny_config
from rlboost.models.checkpoint import init_random

ARCHS = ["llama", "qwen2", "qwen3"]
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
# head_dim 16, theta 1e4: wavelengths 6.3, 19.9, 62.8, 199, ... fall in all three llama3 bands
# (kept below 64 / 4 = 16, smoothed between 16 and 64, divided by the factor above 64)
SCALED_ROPE = {"linear": {"rope_type": "linear", "factor": 4.0},
               "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}


def reference_inv_freq(c) -> torch.Tensor:
    """RoPE inverse frequencies in float64, with the linear or llama3 scaling as published."""
    D = c.head_dim
    inv = 1.0 / c.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    s = c.rope_scaling or {}
    if s.get("rope_type") == "linear":
        return inv / s["factor"]
    if s.get("rope_type") == "llama3":
        old, low, high, factor = (s["original_max_position_embeddings"], s["low_freq_factor"],
                                  s["high_freq_factor"], s["factor"])
        out = []
        for f in inv.tolist():
            wavelen = 2 * math.pi / f
            if wavelen < old / high:
                out.append(f)
            elif wavelen > old / low:
                out.append(f / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return torch.tensor(out, dtype=torch.float64)
    return inv


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """The decoder written out head by head in float64, straight from the architecture."""
    c = model.config
    w = {k: v.double() for k, v in model.state_dict().items()}
    T, D, G = len(ids), c.head_dim, c.num_query_groups
    inv = reference_inv_freq(c)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rms(v, weight):
        return weight * v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)

    def rope(v):
        return v * cos + torch.cat([-v[:, D // 2:], v[:, :D // 2]], -1) * sin

    def lin(v, name):
        out = v @ w[f"{name}.weight"].T
        return out + w[f"{name}.bias"] if f"{name}.bias" in w else out

    x = w["model.embed_tokens.weight"][ids]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj").view(T, -1, D)
        k = lin(h, p + "self_attn.k_proj").view(T, -1, D)
        v = lin(h, p + "self_attn.v_proj").view(T, -1, D)
        if c.qk_norm:
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        heads = []
        for head in range(c.num_attention_heads):
            scores = rope(q[:, head]) @ rope(k[:, head // G]).T / math.sqrt(D)
            heads.append(torch.softmax(scores.masked_fill(future, -math.inf), -1) @ v[:, head // G])
        x = x + lin(torch.cat(heads, -1), p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + lin(F.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, w["model.norm.weight"]) @ head.T


@pytest.mark.parametrize("arch", ARCHS)
def test_matches_reference_math(tmp_path, arch):
    model = load_pretrained(build_tiny_checkpoint(tmp_path, arch=arch, seed=2))
    ids = torch.randint(0, model.config.vocab_size, (17,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids[None])[0].double()
    torch.testing.assert_close(got, reference_logits(model, ids.tolist()), rtol=0, atol=1e-4)


@pytest.mark.parametrize("scaling", sorted(SCALED_ROPE))
def test_scaled_rope_matches_reference_math(scaling):
    config = dataclasses.replace(tiny_config("llama"), rope_scaling=SCALED_ROPE[scaling])
    model = init_random(empty_model(config), 5)
    ids = torch.randint(0, config.vocab_size, (90,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(ids[None])[0].double()
    torch.testing.assert_close(got, reference_logits(model, ids.tolist()), rtol=0, atol=1e-4)
    plain = dataclasses.replace(config, rope_scaling=None)
    assert not torch.allclose(reference_inv_freq(plain), reference_inv_freq(config))  # scaling changes it


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_equals_each_sequence_alone(tmp_path, side):
    model = load_pretrained(build_tiny_checkpoint(tmp_path, arch="qwen2"))
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 259, (n,), generator=gen) for n in (9, 4, 1)]
    batch = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for i, s in enumerate(seqs):
        span = slice(0, len(s)) if side == "right" else slice(9 - len(s), 9)
        batch[i, span], mask[i, span] = s, 1
    with torch.no_grad():
        logits = model(batch, mask)
        for i, s in enumerate(seqs):
            span = slice(0, len(s)) if side == "right" else slice(9 - len(s), 9)
            torch.testing.assert_close(logits[i, span], model(s[None])[0], rtol=0, atol=1e-5)
    assert torch.isfinite(logits).all()


def test_gradients_reach_every_parameter(tmp_path):
    model = load_pretrained(build_tiny_checkpoint(tmp_path, arch="qwen3"))
    ids = torch.randint(0, 259, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    logp = torch.log_softmax(model(ids, mask)[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    (-(logp * mask[:, 1:]).sum()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_bad_shapes_are_refused(tmp_path):
    model = load_pretrained(build_tiny_checkpoint(tmp_path, arch="llama"))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[1, 2, 3]]), torch.ones(1, 2))


def _hf_checkpoints(tmp_path):
    out = {arch: build_tiny_checkpoint(tmp_path / arch, arch=arch, seed=4) for arch in ARCHS}
    scaled = dataclasses.replace(tiny_config("llama"), rope_scaling=LLAMA3_ROPE, rope_theta=500000.0)
    out["llama3-rope"] = save_pretrained(init_random(empty_model(scaled), 4), tmp_path / "llama3")
    linear = dataclasses.replace(tiny_config("llama"), rope_scaling=SCALED_ROPE["linear"])
    out["linear-rope"] = save_pretrained(init_random(empty_model(linear), 4), tmp_path / "linear")
    return out


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="optional cross-check: needs transformers (pip install 'rlboost[smollm2]')")
def test_matches_hugging_face_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 259, (2, 40), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    for name, ckpt in _hf_checkpoints(tmp_path).items():
        hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
        ours = load_pretrained(ckpt)
        assert set(hf.state_dict()) >= set(ours.named_weights())
        with torch.no_grad():
            a, b = ours(ids, mask), hf(input_ids=ids, attention_mask=mask).logits
        valid = mask.bool()
        torch.testing.assert_close(a[valid], b[valid], rtol=0, atol=1e-4, msg=name)
