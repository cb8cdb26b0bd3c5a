"""The trainer's memory plan: qwen3_gpu (Qwen3-8B, responses up to 14,336 tokens, 4 ranks)
fits an H100 with activation checkpointing and optimizer offload, does not without them,
and its launch is then refused in one line naming the largest term and the setting that
shrinks it, before any GPU is looked for. The plan's peak is the fullest phase of a step,
and its activations are the bytes autograd really keeps in rlboost's decoder."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlboost.cli import main
from rlboost.config.overrides import apply_overrides
from rlboost.errors import ConfigError
from rlboost.models.checkpoint import empty_model, init_random, tiny_config
from rlboost.recipes import get_recipe
from rlboost.run.job import preflight
from rlboost.run.plan import run_memory_plan
from rlboost.trainer.memory import KNOWN_MODELS, PHASES, ModelDims, plan_trainer_memory


def _config(*sets: str):
    return apply_overrides(get_recipe("qwen3_gpu"), list(sets))


def test_qwen3_gpu_fits_an_h100():
    plan = run_memory_plan(_config())
    assert plan.device == "h100-sxm" and plan.capacity_bytes == 80e9
    assert plan.fits and plan.total_bytes < 0.5 * plan.capacity_bytes


@pytest.mark.parametrize("sets", [("trainer.activation_checkpointing=false",),
                                  ("trainer.activation_checkpointing=false", "trainer.optimizer.offload=false")])
def test_without_checkpointing_it_does_not_fit_and_launch_is_refused(sets):
    config = _config(*sets)
    plan = run_memory_plan(config)
    assert not plan.fits and plan.largest.name.startswith("activations")
    with pytest.raises(ConfigError) as err:
        preflight(config)  # refused on the plan, before the machine's GPUs are counted
    line = str(err.value)
    assert "\n" not in line and "activations" in line and "trainer.activation_checkpointing=true" in line
    assert plan.peak_phase in line


def test_without_offload_the_optimizer_terms_come_back():
    with_offload, without = run_memory_plan(_config()), run_memory_plan(_config("trainer.optimizer.offload=false"))
    terms = {t.name: t.nbytes for t in without.terms}
    assert terms["optimizer state"] == pytest.approx(2 * 4 * KNOWN_MODELS["qwen3-8b"].params / 4)
    assert without.total_bytes > with_offload.total_bytes


def test_plan_command_prints_a_table(capsys):
    assert main(["plan", "--recipe", "qwen3_gpu"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-8b" in out.lower() and "activations" in out and "fits" in out
    assert main(["plan", "--recipe", "qwen3_gpu", "--set", "trainer.activation_checkpointing=false"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_dims_from_a_config_json_count_qwen3_8b_parameters():
    hf = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
          "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
          "tie_word_embeddings": False}
    dims = ModelDims.from_hf_config(hf, name="qwen3-8b")
    assert dataclasses.replace(dims, name="qwen3-8b") == KNOWN_MODELS["qwen3-8b"]
    assert 8.1e9 < dims.params < 8.3e9  # the model card's 8.2B


def test_the_peak_is_the_fullest_phase_not_every_term_at_once():
    plan = run_memory_plan(_config("trainer.optimizer.offload=false"))
    totals = dict(zip(PHASES, plan.phase_totals))
    assert plan.total_bytes == max(totals.values()) == totals[plan.peak_phase]
    assert plan.total_bytes < sum(t.nbytes for t in plan.terms)  # the logits are gone before the step's scratch
    by_name = {t.name: t for t in plan.terms}
    assert by_name["optimizer step scratch"].phases[:-1] == (0.0,) * (len(PHASES) - 1)
    assert by_name["logits and log-prob chunk"].phases[-2:] == (0.0, 0.0)


def test_with_offload_the_device_holds_no_shards_and_no_step():
    plan = run_memory_plan(_config())
    by_name = {t.name: t for t in plan.terms}
    assert by_name["optimizer state"].nbytes == 0 and by_name["optimizer step scratch"].nbytes == 0
    assert by_name["parameters"].phases[0] == 0  # only gathered copies, and none outside backward
    assert plan.phase_totals[-1] == by_name["NCCL buffers and CUDA context"].nbytes


def _dims(cfg) -> ModelDims:
    return ModelDims("tiny", cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
                     cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, tied=cfg.tie_word_embeddings,
                     qk_norm=cfg.qk_norm)


def _saved_bytes(model, ids, seq_lens) -> tuple[int, int]:
    """(bytes autograd keeps for backward in one packed forward, those first kept inside layer 1),
    counting each storage once and leaving out the parameters and the token ids."""
    first: dict[int, tuple[object, int]] = {}
    where: list[object] = [None]

    def pack(t):
        s = t.untyped_storage()
        first.setdefault(s.data_ptr(), (where[0], s.nbytes()))
        return t

    hooks = [h for i, layer in enumerate(model.model.layers) for h in (
        layer.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i)),
        layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, None)))]
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()} | {ids.untyped_storage().data_ptr()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, seq_lens=seq_lens).sum().backward()
    for h in hooks:
        h.remove()
    kept = {ptr: v for ptr, v in first.items() if ptr not in skip}
    return sum(n for _, n in kept.values()), sum(n for w, n in kept.values() if w == 1)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_planned_activations_are_what_autograd_keeps(arch, dtype, checkpointing):
    cfg = tiny_config(arch, num_layers=3)
    model = init_random(empty_model(cfg), seed=0).to(dtype)
    model.activation_checkpointing = checkpointing
    seq_lens = (37, 21, 6)
    ids = torch.randint(1, cfg.vocab_size, (1, sum(seq_lens)), generator=torch.Generator().manual_seed(0))
    total, layer = _saved_bytes(model, ids, seq_lens)
    dims, b, tokens = _dims(cfg), dtype.itemsize, sum(seq_lens)
    if checkpointing:  # each layer's input, nothing from inside a layer
        assert layer == 0
        assert total == (dims.layers * dims.hidden * b + dims.shared_activation_bytes_per_token(b)) * tokens
    else:
        assert layer == dims.activation_bytes_per_token(b) * tokens
        assert total == (dims.layers * dims.activation_bytes_per_token(b)
                         + dims.shared_activation_bytes_per_token(b)) * tokens
    plan = plan_trainer_memory(dims, world_size=1, tokens=tokens, compute_bytes=b, checkpointing=checkpointing,
                               offload=False, gathered_copies=False)
    forward = next(t for t in plan.terms if t.name.startswith("activations")).phases[0]
    assert forward == total
