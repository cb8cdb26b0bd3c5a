"""The chunked GRPO log-probs on a GPU: the same values and gradients as the float32 upcast
(their memory on the GPU is measured by bench/logprob_memory.py --device cuda)."""

import pytest
import torch

from rlboost.trainer.grpo import token_logprobs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def naive_logprobs(logits, ids):
    pred = logits[:, :-1, :].float()
    picked = pred.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(pred, dim=-1)
    return torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradients_match_the_upcast_on_cuda(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (3 * torch.randn(4, 300, 151936 // 16, generator=g, device="cuda")).to(dtype)
    ids = torch.randint(0, logits.shape[-1], logits.shape[:2], generator=g, device="cuda")
    weight = torch.randn(logits.shape[:2], generator=g, device="cuda")
    got_leaf, want_leaf = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    got = token_logprobs(got_leaf, ids, chunk_bytes=1 << 20)  # many chunks, a ragged last one
    want = naive_logprobs(want_leaf, ids)
    (got * weight).sum().backward()
    (want * weight).sum().backward()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert got_leaf.grad.dtype == dtype and got_leaf.grad.is_cuda
    if dtype == torch.float32:
        torch.testing.assert_close(got_leaf.grad, want_leaf.grad, rtol=0, atol=1e-5)
    else:  # both round the same float32 gradient to bfloat16
        torch.testing.assert_close(got_leaf.grad, want_leaf.grad)
