"""FSDP2 over 2 gloo ranks matches one unsharded process: loss, gradients, optimizer step
and the bucketed full-weight gather, on tiny DecoderLM checkpoints (Qwen3 with tied
embeddings and q/k norms, Qwen2 with q/k/v biases and an untied head).

Tolerance: float32 sums over different reduction orders, so losses agree to 1e-5
relative and gradients to rtol 1e-4 / atol 1e-6; the gathered weights are bit-exact.
"""

import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.trainer import fsdp
from rlboost.trainer.batch import ScoredSample, build_micro_batch, micro_batch_loss
from rlboost.trainer.grpo import GRPOConfig

WORLD = 2
ARCHS = ("qwen3", "qwen2")
VOCAB = 263  # odd: dim 0 of the embedding splits 132 + 131, an uneven shard
# Adam divides by sqrt(v) + eps: with the default eps, gradients that are zero in exact
# arithmetic (the key bias) but ~1e-9 in float32 become full-size steps of either sign.
# eps=1e-4 keeps such noise below the comparison tolerance.
OPT = fsdp.OptimizerConfig(lr=1e-2, eps=1e-4, max_grad_norm=None)


def _write_checkpoints(root) -> dict[str, str]:
    return {arch: str(build_tiny_checkpoint(root / arch, arch=arch, seed=1, vocab_size=VOCAB,
                                            hidden_size=32, intermediate_size=64, num_layers=2))
            for arch in ARCHS}


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


def _step_denominator() -> int:
    return build_micro_batch(_samples(), pad_id=0).num_response_tokens


def _worker(rank: int, rendezvous: str, checkpoints: dict[str, str], out_dir: str) -> None:
    torch.set_num_threads(1)  # two ranks share two cores
    # A file rendezvous: no port to race for with other processes on a shared machine.
    mesh = fsdp.init_distributed(rank, WORLD, timeout_s=120, init_method=rendezvous)
    try:
        for arch, path in checkpoints.items():
            _sharded_step(rank, mesh, path, f"{out_dir}/{arch}.pt")
        _bf16_step(rank, mesh, checkpoints["qwen2"], f"{out_dir}/bf16.pt")
        _into_step(rank, mesh, checkpoints["qwen3"], f"{out_dir}/into.pt")
    except BaseException:
        fsdp.destroy_distributed(barrier=False)
        raise
    fsdp.destroy_distributed()


def _sharded_step(rank, mesh, checkpoint: str, out_path: str) -> None:
    model = fsdp.shard_model(load_pretrained(checkpoint), mesh, fsdp.FSDPConfig())
    before = fsdp.full_state_dict(model, bucket_bytes=1024)
    bf16 = fsdp.full_state_dict(model, bucket_bytes=4096, dtype=torch.bfloat16)
    # each rank trains on its own prompt group; FSDP sums the gradients
    mine = [s for s in _samples() if s.group_id == rank]
    out = micro_batch_loss(model, build_micro_batch(mine, pad_id=0), GRPOConfig(),
                           denominator=_step_denominator())
    out.loss.backward()
    loss = out.loss.detach().clone()
    torch.distributed.all_reduce(loss)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    norm = fsdp.optimizer_step(model, fsdp.build_optimizer(model, OPT), OPT)
    after = fsdp.full_state_dict(model, bucket_bytes=1 << 20)
    if rank == 0:
        torch.save({"before": before, "bf16": bf16, "loss": loss, "grads": grads,
                    "norm": norm, "after": after}, out_path)
    else:
        assert before == {} and after == {}, "only rank 0 receives the gathered weights"


def _bf16_step(rank, mesh, checkpoint: str, out_path: str) -> None:
    cfg = fsdp.FSDPConfig(param_dtype="bfloat16", reduce_dtype="float32")
    model = fsdp.shard_model(load_pretrained(checkpoint), mesh, cfg)
    mine = [s for s in _samples() if s.group_id == rank]
    out = micro_batch_loss(model, build_micro_batch(mine, pad_id=0), GRPOConfig(),
                           denominator=_step_denominator())
    out.loss.backward()
    loss = out.loss.detach().float().clone()
    torch.distributed.all_reduce(loss)
    grad_dtypes = {p.grad.dtype for p in model.parameters()}
    weights = fsdp.full_state_dict(model)
    if rank == 0:
        torch.save({"loss": loss, "grad_dtypes": grad_dtypes,
                    "weight_dtypes": {t.dtype for t in weights.values()}}, out_path)


def _into_step(rank, mesh, checkpoint: str, out_path: str) -> None:
    model = fsdp.shard_model(load_pretrained(checkpoint), mesh)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    staging = {n: torch.full(shape, -1.0, dtype=torch.bfloat16) for n, shape in shapes.items()}
    yielded = list(fsdp.iter_full_parameters(model, bucket_bytes=2048, dtype=torch.bfloat16,
                                             into=staging if rank == 0 else None))
    assert all(t is staging[n] for n, t in yielded)
    bad = dict(staging, **{"model.norm.weight": torch.empty(3, dtype=torch.bfloat16)})
    try:
        list(fsdp.iter_full_parameters(model, dtype=torch.bfloat16,
                                       into=bad if rank == 0 else None))
        error = None
    except ValueError as exc:
        error = str(exc)
    errors = [None] * WORLD
    torch.distributed.all_gather_object(errors, error)
    if rank == 0:
        torch.save({"staging": staging, "errors": errors}, out_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return _write_checkpoints(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory, checkpoints):
    out_dir = tmp_path_factory.mktemp("fsdp")
    rendezvous = f"file://{out_dir / 'rendezvous'}"
    mp.spawn(_worker, args=(rendezvous, checkpoints, str(out_dir)), nprocs=WORLD, join=True)
    runs = {arch: torch.load(out_dir / f"{arch}.pt") for arch in ARCHS}
    runs["bf16"] = torch.load(out_dir / "bf16.pt")
    runs["into"] = torch.load(out_dir / "into.pt")
    return runs


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def sharded_run(sharded_runs, arch):
    return sharded_runs[arch]


@pytest.fixture(scope="module")
def single_run(checkpoints, arch):
    model = load_pretrained(checkpoints[arch])
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = micro_batch_loss(model, build_micro_batch(_samples(), pad_id=0), GRPOConfig())
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = fsdp.optimizer_step(model, fsdp.build_optimizer(model, OPT), OPT)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"initial": initial, "loss": out.loss.detach(), "grads": grads, "norm": norm,
            "after": after}


def test_two_ranks_give_the_single_process_loss_and_gradients(sharded_run, single_run):
    assert sharded_run["loss"].item() == pytest.approx(single_run["loss"].item(), rel=1e-5)
    assert sharded_run["grads"].keys() == single_run["grads"].keys()
    for name, grad in single_run["grads"].items():
        assert grad.abs().sum() > 0, f"{name} got no gradient"
        torch.testing.assert_close(sharded_run["grads"][name], grad, rtol=1e-4, atol=1e-6)


def test_bucketed_gather_returns_exactly_the_unsharded_parameters(sharded_run, single_run):
    before = sharded_run["before"]
    assert list(before) == list(single_run["initial"])  # same names, same order
    for name, tensor in single_run["initial"].items():
        assert before[name].dtype == tensor.dtype and before[name].shape == tensor.shape
        assert torch.equal(before[name], tensor), name
        assert torch.equal(sharded_run["bf16"][name], tensor.to(torch.bfloat16)), name


def test_sharded_optimizer_step_matches_the_single_process_step(sharded_run, single_run):
    assert sharded_run["norm"] == pytest.approx(single_run["norm"], rel=1e-5)
    assert single_run["norm"] > 0
    for name, tensor in single_run["after"].items():
        assert not torch.equal(tensor, single_run["initial"][name]), f"{name} did not move"
        torch.testing.assert_close(sharded_run["after"][name], tensor, rtol=1e-4, atol=1e-5)


def test_bfloat16_compute_keeps_float32_master_weights_and_gradients(sharded_runs, checkpoints):
    run = sharded_runs["bf16"]
    model = load_pretrained(checkpoints["qwen2"])
    full = micro_batch_loss(model, build_micro_batch(_samples(), pad_id=0), GRPOConfig())
    # bfloat16 keeps ~3 significant digits; the loss is a mean of O(1) terms
    assert run["loss"].item() == pytest.approx(full.loss.item(), rel=2e-2, abs=2e-2)
    assert run["grad_dtypes"] == {torch.float32} and run["weight_dtypes"] == {torch.float32}


def test_gather_writes_into_caller_buffers_and_rejects_bad_ones_on_every_rank(
        sharded_runs, checkpoints):
    run = sharded_runs["into"]
    reference = load_pretrained(checkpoints["qwen3"])
    for name, p in reference.named_parameters():
        assert torch.equal(run["staging"][name], p.to(torch.bfloat16)), name
    assert "model.norm.weight" in run["errors"][0] and "expected" in run["errors"][0]
    assert run["errors"][1] is not None  # the other rank fails too instead of hanging


def test_tcp_rendezvous_for_one_rank(checkpoints):
    mesh = fsdp.init_distributed(0, 1, "127.0.0.1", _free_port(), timeout_s=60)
    try:
        assert mesh.size() == 1 and torch.distributed.get_backend() == "gloo"
        model = fsdp.shard_model(load_pretrained(checkpoints["qwen2"]), mesh)
        reference = load_pretrained(checkpoints["qwen2"])
        got = fsdp.full_state_dict(model, bucket_bytes=4096)
        assert all(torch.equal(got[n], p) for n, p in reference.named_parameters())
    finally:
        fsdp.destroy_distributed()
    assert not torch.distributed.is_initialized()


def test_the_step_denominator_is_required_under_a_process_group(checkpoints):
    # Gradients are summed over ranks and micro-batches: a per-micro-batch mean would be
    # scaled by both, silently changing the step size and what max_grad_norm clips.
    mesh = fsdp.init_distributed(0, 1, "127.0.0.1", _free_port(), timeout_s=60)
    try:
        model = fsdp.shard_model(load_pretrained(checkpoints["qwen2"]), mesh)
        batch = build_micro_batch(_samples(), pad_id=0)
        with pytest.raises(ValueError, match="denominator"):
            micro_batch_loss(model, batch, GRPOConfig())
        out = micro_batch_loss(model, batch, GRPOConfig(), denominator=batch.num_response_tokens)
        assert torch.isfinite(out.loss)
    finally:
        fsdp.destroy_distributed()


def test_tied_head_is_published_once_as_the_embedding(sharded_runs):
    assert "lm_head.weight" not in sharded_runs["qwen3"]["before"]
    assert "lm_head.weight" in sharded_runs["qwen2"]["before"]


def test_unsharded_module_streams_its_own_parameters(checkpoints):
    model = load_pretrained(checkpoints["qwen2"])
    got = dict(fsdp.iter_full_parameters(model, bucket_bytes=2048))
    assert list(got) == [n for n, _ in model.named_parameters()]
    assert all(torch.equal(got[n], p) for n, p in model.named_parameters())
    # fresh tensors: a later optimizer step (or the caller) cannot change one through the other
    for name, p in model.named_parameters():
        assert got[name].untyped_storage().data_ptr() != p.untyped_storage().data_ptr(), name
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    assert not torch.equal(got["model.norm.weight"], model.model.norm.weight)


def test_models_without_decoder_layers_are_rejected():
    with pytest.raises(ValueError, match="model.model.layers"):
        fsdp.decoder_layers(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kwargs,field", [
    ({"param_dtype": "fp8"}, "param_dtype"), ({"grad_reduction": "max"}, "grad_reduction"),
    ({"gather_bucket_mb": 0}, "gather_bucket_mb")])
def test_fsdp_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        fsdp.FSDPConfig(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    ({"lr": 0.0}, "lr"), ({"beta2": 1.0}, "beta2"), ({"max_grad_norm": 0.0}, "max_grad_norm")])
def test_optimizer_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        fsdp.OptimizerConfig(**kwargs)
