"""FSDP2 on NCCL with one rank: one GRPO step on the GPU gives the loss, gradients and updated
weights of the same step on the CPU (float32; reductions differ in order, hence tolerances)."""

import pytest
import torch
import torch.multiprocessing as mp

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.trainer import fsdp
from rlboost.trainer.batch import ScoredSample, build_micro_batch, micro_batch_loss
from rlboost.trainer.grpo import GRPOConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

VOCAB = 263
# Adam divides by sqrt(v) + eps: gradients that are zero in exact arithmetic but ~1e-9 in
# float32 would become full-size steps of either sign with the default eps.
OPT = fsdp.OptimizerConfig(lr=1e-2, eps=1e-4, max_grad_norm=1.0)
CONFIG = GRPOConfig(kl_coef=0.0)


def _samples() -> list[ScoredSample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(8):
        n_out = 2 + i % 4
        out.append(ScoredSample(
            sample_id=i, group_id=i // 4,
            prompt_ids=tuple(torch.randint(1, VOCAB, (3 + i % 3,), generator=g).tolist()),
            output_ids=tuple(torch.randint(1, VOCAB, (n_out,), generator=g).tolist()),
            output_logprobs=tuple((-5.6 + 0.2 * i,) * n_out), reward=float(i % 3)))
    return out


def _step(model, device) -> dict:
    batch = build_micro_batch(_samples(), pad_id=0).to(device)
    out = micro_batch_loss(model, batch, CONFIG, denominator=batch.denominator(CONFIG.aggregation))
    out.loss.backward()
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().cpu()
             for n, p in model.named_parameters()}
    norm = fsdp.optimizer_step(model, fsdp.build_optimizer(model, OPT), OPT)
    return {"loss": out.loss.detach().cpu(), "grads": grads, "norm": norm}


def _gpu_rank(rank: int, rendezvous: str, checkpoint: str, out_path: str) -> None:
    mesh = fsdp.init_distributed(0, 1, backend="nccl", init_method=rendezvous, timeout_s=120)
    try:
        model = fsdp.shard_model(load_pretrained(checkpoint, device=torch.device("cuda", 0)), mesh)
        result = _step(model, "cuda")
        result["after"] = fsdp.full_state_dict(model)
        torch.save(result, out_path)
        del model
    except BaseException:
        fsdp.destroy_distributed(barrier=False)
        raise
    fsdp.destroy_distributed()


def test_one_grpo_step_on_nccl_matches_the_cpu_step(tmp_path):
    checkpoint = str(build_tiny_checkpoint(tmp_path / "ckpt", arch="qwen3", seed=1, vocab_size=VOCAB,
                                           hidden_size=32, intermediate_size=64, num_layers=2))
    mp.spawn(_gpu_rank, args=(f"file://{tmp_path / 'rendezvous'}", checkpoint, str(tmp_path / "gpu.pt")),
             nprocs=1, join=True)
    gpu = torch.load(tmp_path / "gpu.pt")
    model = load_pretrained(checkpoint)
    cpu = _step(model, "cpu")
    after = {n: t.detach() for n, t in model.state_dict().items()}
    torch.testing.assert_close(gpu["loss"], cpu["loss"], rtol=1e-5, atol=1e-6)
    assert gpu["norm"] == pytest.approx(cpu["norm"], rel=1e-4)
    assert set(gpu["grads"]) == set(cpu["grads"])
    for name, grad in cpu["grads"].items():
        torch.testing.assert_close(gpu["grads"][name], grad, rtol=1e-4, atol=1e-6)
    for name, weight in gpu["after"].items():
        torch.testing.assert_close(weight, after[name], rtol=1e-4, atol=1e-5)
