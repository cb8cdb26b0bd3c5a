"""On one CUDA GPU: packed sequences give the padded loss and gradients (bfloat16, through
flash-attn's varlen kernel where it is installed, else per-sample SDPA), and activation
checkpointing lowers the step's peak memory while giving the same gradients."""

import pytest
import torch

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.trainer.batch import ScoredSample, build_micro_batch, micro_batch_loss
from rlboost.trainer.grpo import GRPOConfig
from rlboost.trainer.split import split_for_ranks

pytestmark = pytest.mark.gpu
VOCAB = 4096


def _batch():
    g = torch.Generator().manual_seed(0)
    lengths = [900, 60, 40, 300, 25, 120, 700, 30]
    samples = [ScoredSample(sample_id=i, group_id=i // 4, prompt_ids=tuple(torch.randint(1, VOCAB, (8,), generator=g).tolist()),
                            output_ids=tuple(torch.randint(1, VOCAB, (n,), generator=g).tolist()),
                            output_logprobs=(-8.0,) * n, reward=float(i % 3)) for i, n in enumerate(lengths)]
    return build_micro_batch(samples, pad_id=0)


def _step(path, part, checkpointing, dtype):
    torch.cuda.reset_peak_memory_stats()
    model = load_pretrained(path, device="cuda").to(dtype)
    model.activation_checkpointing = checkpointing
    base = torch.cuda.memory_allocated()
    out = micro_batch_loss(model, part.to("cuda"), GRPOConfig(), denominator=1.0)
    out.loss.backward()
    peak = torch.cuda.max_memory_allocated() - base
    return float(out.loss), {n: p.grad.float().cpu() for n, p in model.named_parameters()}, peak


def test_packed_equals_padded_and_checkpointing_saves_memory(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    path = build_tiny_checkpoint(tmp_path / "m", arch="qwen3", vocab_size=VOCAB, hidden_size=256,
                                 intermediate_size=768, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=32)
    batch = _batch()
    padded, packed = (split_for_ranks(batch, 1, packed=p)[0][0] for p in (False, True))
    loss_pad, grads_pad, _ = _step(path, padded, False, torch.bfloat16)
    loss_pack, grads_pack, peak_keep = _step(path, packed, False, torch.bfloat16)
    loss_ck, grads_ck, peak_ck = _step(path, packed, True, torch.bfloat16)
    assert loss_pack == pytest.approx(loss_pad, rel=2e-2, abs=2e-2)
    for n, g in grads_pad.items():
        scale = float(g.abs().max()) + 1e-6
        assert float((grads_pack[n] - g).abs().max()) <= 0.05 * scale, n
        assert float((grads_ck[n] - grads_pack[n]).abs().max()) <= 0.02 * scale, n
    assert peak_ck < peak_keep
