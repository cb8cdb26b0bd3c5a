"""model.impl=transformers: a transformers causal LM outside rlboost's three families (a tiny
MistralForCausalLM built from a config, nothing downloaded) trains 3 GRPO steps with FSDP2
on 2 CPU ranks, and every instance pulls its weights by the normal pull. The rollout is
the emulated engine: the embedded engine serves only rlboost's decoders and refuses this
checkpoint in one line, and SGLang and vLLM need a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from rlboost.models import ByteTokenizer  # noqa: E402

ARGS = ["--set", "run.steps=3", "--set", "run.progress=false", "--set", "run.checkpoint_every=10",
        "--set", "model.source=path", "--set", "model.impl=transformers", "--set", "model.warmup_steps=0",
        "--set", "task.groups_per_step=4", "--set", "task.group_size=4", "--set", "task.max_new_tokens=12",
        "--set", "trainer.microbatch_groups=2", "--set", "trainer.max_tokens_per_micro_batch=64",
        "--set", "trainer.activation_checkpointing=true", "--set", "rollout.capacity=16",
        "--set", "rollout.backend=emulated", "--set", "rollout.emulated.decode_tokens_per_s=400",
        "--set", "rollout.emulated.sample_tokens_per_s=40", "--set", "rollout.emulated.stop_probability=0.05",
        "--set", "cluster.trace=none", "--set", "cluster.max_preemptible=1", "--set", "cluster.initial_preemptible=1"]


def _mistral(directory: Path) -> Path:
    tok = ByteTokenizer()
    config = transformers.MistralConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                        max_position_embeddings=512, sliding_window=None,
                                        bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    transformers.set_seed(0)
    transformers.MistralForCausalLM(config).save_pretrained(str(directory))
    tok.save(directory)
    return directory


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RLBOOST_RUN_ROOT=str(tmp_path / "runs"),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", HF_HUB_OFFLINE="1")
    env.pop("RLBOOST_RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "rlboost.cli", "train", *ARGS, *extra], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)


def test_a_mistral_trains_three_steps_and_instances_pull_its_weights(tmp_path):
    ckpt = _mistral(tmp_path / "mistral")
    proc = _run(tmp_path, "--set", f"model.path={ckpt}")
    assert proc.returncode == 0, f"rlboost train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    run = Path(proc.stdout.strip().splitlines()[-1])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["samples_trained"] == 16 and m["weight_version"] == m["step"]
        assert m["publish_bytes"] > 0
    kinds = [(e["kind"], e.get("instance")) for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())]
    assert ("active", "spot-s0") in kinds  # it pulled the trainer's weights before serving


def test_the_embedded_engine_refuses_a_mistral_in_one_line(tmp_path):
    ckpt = _mistral(tmp_path / "mistral")
    proc = _run(tmp_path, "--set", f"model.path={ckpt}", "--set", "rollout.backend=embedded")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "MistralForCausalLM" in lines[0] and "sglang" in lines[0].lower()
