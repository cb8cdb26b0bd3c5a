"""token_logprobs computed chunk by chunk: the same loss and gradients as the float32 upcast of
the whole [B, T, V] logits, without ever holding such an upcast (forward or backward)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from rlboost.trainer.grpo import GRPOConfig, grpo_loss, token_logprobs


def naive_logprobs(logits, ids, mask=None, temperature=1.0):
    """The whole-tensor float32 upcast (rlboost's earlier code, and the textbook form)."""
    pred = logits[:, :-1, :].float() / temperature
    picked = pred.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(pred, dim=-1)
    out = torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)
    return out if mask is None else torch.where(mask, out, torch.zeros_like(out))


def _case(dtype=torch.float32, batch=3, length=9, vocab=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(batch, length, vocab, generator=g)).to(dtype)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.rand(batch, length, generator=g) > 0.3
    mask[:, 0] = False
    old = -torch.rand(batch, length, generator=g)
    adv = torch.randn(batch, generator=g)
    return logits, ids, mask, old, adv


def _loss_and_grad(fn, logits, ids, mask, old, adv, config):
    leaf = logits.detach().clone().requires_grad_(True)
    lp = fn(leaf, ids, mask)
    out = grpo_loss(lp, old, adv, mask, config, ref_logprobs=old - 0.1)
    out.loss.backward()
    return out.loss.detach(), leaf.grad


@pytest.mark.parametrize("chunk_bytes", [4 * 37 * 2, 4 * 37 * 3 + 5, 64 << 20])  # ragged, exact, whole
def test_loss_and_gradients_equal_the_float32_upcast(chunk_bytes):
    logits, ids, mask, old, adv = _case()
    config = GRPOConfig(kl_coef=0.05)
    want_loss, want_grad = _loss_and_grad(naive_logprobs, logits, ids, mask, old, adv, config)
    got_loss, got_grad = _loss_and_grad(
        lambda x, i, m: token_logprobs(x, i, m, chunk_bytes=chunk_bytes), logits, ids, mask, old, adv, config)
    torch.testing.assert_close(got_loss, want_loss, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-5)
    assert got_grad[:, -1].abs().max() == 0  # the last position predicts nothing


def test_the_logits_are_left_as_they_were():
    logits, ids, mask, *_ = _case()
    leaf = logits.clone().requires_grad_(True)
    token_logprobs(leaf, ids, mask, temperature=0.5, chunk_bytes=300).sum().backward()
    assert torch.equal(leaf.detach(), logits)


def test_temperature_divides_the_logits():
    logits, ids, mask, *_ = _case()
    torch.testing.assert_close(token_logprobs(logits, ids, mask, temperature=0.7),
                               naive_logprobs(logits, ids, mask, temperature=0.7), rtol=0, atol=1e-5)
    leaf = logits.clone().requires_grad_(True)
    token_logprobs(leaf, ids, mask, temperature=0.7, chunk_bytes=300).sum().backward()
    ref = logits.clone().requires_grad_(True)
    naive_logprobs(ref, ids, mask, temperature=0.7).sum().backward()
    torch.testing.assert_close(leaf.grad, ref.grad, rtol=0, atol=1e-5)


def test_bf16_logits_get_bf16_gradients_close_to_the_upcast():
    logits, ids, mask, *_ = _case(torch.bfloat16)
    leaf = logits.clone().requires_grad_(True)
    out = token_logprobs(leaf, ids, mask)
    assert out.dtype == torch.float32
    out.sum().backward()
    ref = logits.clone().requires_grad_(True)
    want = naive_logprobs(ref, ids, mask)
    want.sum().backward()
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    assert leaf.grad.dtype == torch.bfloat16
    torch.testing.assert_close(leaf.grad, ref.grad)


def test_no_float32_copy_of_the_logits_is_made():
    """The point of the chunking: the largest float32 tensor is one chunk, not [B, T, V]."""
    logits, ids, mask, *_ = _case(torch.bfloat16, batch=2, length=64, vocab=1000)
    leaf = logits.clone().requires_grad_(True)
    with _LargestFloat32() as seen:
        token_logprobs(leaf, ids, mask, chunk_bytes=8 * 4 * 1000).sum().backward()
    assert seen.numel <= 8 * 1000
    with _LargestFloat32() as naive:
        naive_logprobs(leaf, ids, mask).sum().backward()
    assert naive.numel == 2 * 63 * 1000  # what the upcast holds


def test_reference_logprobs_without_grad_and_bad_arguments():
    logits, ids, mask, *_ = _case()
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(logits, ids, mask), naive_logprobs(logits, ids, mask),
                                   rtol=0, atol=1e-5)
    for kwargs, field in (({"temperature": 0.0}, "temperature"), ({"chunk_bytes": 0}, "chunk_bytes")):
        with pytest.raises(ValueError, match=field):
            token_logprobs(logits, ids, mask, **kwargs)
    one = token_logprobs(logits[:, :1], ids[:, :1])
    assert one.shape == (3, 1) and not one.any()


class _LargestFloat32(TorchDispatchMode):
    """Records the element count of the largest float32 tensor any op returns."""

    numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.numel = max(self.numel, t.numel())
        return out
