"""Every --set path reaches its field: each field of RunConfig can be set from the command
line with a value of its type, and every path earlier releases accepted still does (fields
that moved are found at their new place), so scripts and old config.json files keep working."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlboost.config.describe import describe
from rlboost.config.overrides import apply_overrides, current_path, from_dict, to_dict
from rlboost.config.run import RunConfig

# every field `rlboost train --set` took in the first release (secrets never came from --set)
EARLIER_PATHS = [
    "model.source",
    "model.path",
    "model.arch",
    "model.hidden_size",
    "model.intermediate_size",
    "model.num_layers",
    "model.num_heads",
    "model.num_kv_heads",
    "model.head_dim",
    "model.seed",
    "model.warmup_steps",
    "model.warmup_batch",
    "model.warmup_lr",
    "task.name",
    "task.arithmetic.min_operand",
    "task.arithmetic.max_operand",
    "task.arithmetic.num_operands",
    "task.arithmetic.operators",
    "task.arithmetic.non_negative",
    "task.arithmetic.reward_mode",
    "task.arithmetic.format_reward",
    "task.arithmetic.partial_weight",
    "task.math_path",
    "task.math_prompt_field",
    "task.math_answer_field",
    "task.math_answer_format",
    "task.prompt_template",
    "task.chat_template",
    "task.answer",
    "task.groups_per_step",
    "task.group_size",
    "task.max_new_tokens",
    "task.temperature",
    "task.top_p",
    "task.seed",
    "trainer.world_size",
    "trainer.device",
    "trainer.backend",
    "trainer.rendezvous",
    "trainer.rendezvous_dir",
    "trainer.lr",
    "trainer.max_grad_norm",
    "trainer.weight_decay",
    "trainer.adam_eps",
    "trainer.param_dtype",
    "trainer.reduce_dtype",
    "trainer.gather_bucket_mb",
    "trainer.microbatch_groups",
    "trainer.rank_cpus",
    "trainer.rank_gpus",
    "grpo.clip_eps_low",
    "grpo.clip_eps_high",
    "grpo.kl_coef",
    "grpo.normalize_std",
    "grpo.std_eps",
    "grpo.aggregation",
    "controller.poll_interval_s",
    "controller.idle_timeout_s",
    "controller.call_timeout_s",
    "controller.handoff_timeout_s",
    "controller.microbatch_min_samples",
    "controller.microbatch_max_samples",
    "controller.migrate_with_kv",
    "controller.reserved_tokens_per_s",
    "controller.preemptible_tokens_per_s",
    "controller.sample_tokens_per_s",
    "controller.registry.heartbeat_interval_s",
    "controller.registry.missed_beats",
    "controller.registry.drain_margin_s",
    "controller.registry.route_to_draining",
    "controller.router.retry_budget",
    "controller.router.steal_margin",
    "controller.router.min_steal_gain_s",
    "controller.router.max_moves_per_tick",
    "controller.router.prefill_tokens_per_s",
    "rollout.engine.model_dir",
    "rollout.engine.device",
    "rollout.engine.dtype",
    "rollout.engine.num_blocks",
    "rollout.engine.block_size",
    "rollout.engine.max_batch_size",
    "rollout.engine.max_prefill_tokens",
    "rollout.engine.stream_interval",
    "rollout.engine.max_model_len",
    "rollout.engine.weight_version",
    "rollout.engine.rate_window_s",
    "rollout.backend",
    "rollout.emulated.decode_tokens_per_s",
    "rollout.emulated.sample_tokens_per_s",
    "rollout.emulated.prefill_tokens_per_s",
    "rollout.emulated.max_running",
    "rollout.emulated.vocab_size",
    "rollout.emulated.stop_probability",
    "rollout.emulated.eos_token_id",
    "rollout.emulated.rate_window_s",
    "rollout.emulated.max_model_len",
    "rollout.emulated_preemptible_speed",
    "rollout.sglang_tp_size",
    "rollout.sglang_mem_fraction",
    "rollout.capacity",
    "rollout.policy",
    "rollout.instance_cpus",
    "rollout.instance_gpus",
    "rollout.pull_timeout_s",
    "transfer.bind_host",
    "transfer.advertise_host",
    "transfer.port",
    "transfer.relay_port",
    "transfer.transport",
    "transfer.streams",
    "transfer.chunk_bytes",
    "transfer.max_in_flight",
    "transfer.request_timeout_s",
    "transfer.send_timeout_s",
    "transfer.connect_timeout_s",
    "transfer.resolve_timeout_s",
    "transfer.reconnect_attempts",
    "transfer.egress_bytes_per_s",
    "transfer.versions_kept",
    "transfer.alignment",
    "transfer.relay",
    "transfer.commit_threads",
    "transfer.max_connections",
    "transfer.max_handshakes",
    "transfer.handshake_timeout_s",
    "transfer.keep_connections",
    "transfer.connection_idle_s",
    "transfer.relay_poll_s",
    "cluster.address",
    "cluster.num_cpus",
    "cluster.object_store_mb",
    "cluster.reserved_instances",
    "cluster.max_preemptible",
    "cluster.initial_preemptible",
    "cluster.trace",
    "cluster.trace_duration_s",
    "cluster.trace_fraction",
    "cluster.notice_s",
    "cluster.preempt_busy_wait_s",
    "cluster.sudden_fraction",
    "cluster.victim_order",
    "cluster.inject",
    "cluster.seed",
    "cost.reserved_usd_per_hour",
    "cost.preemptible_usd_per_hour",
    "cost.time_scale",
    "run.name",
    "run.steps",
    "run.seed",
    "run.checkpoint_every",
    "run.progress",
    "run.microbatch_timeout_s",
]


def _text(value) -> str:
    """A value as the command line writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _get(config, path: str):
    for name in path.split("."):
        config = getattr(config, name)
    return config


def test_every_field_can_be_set_from_the_command_line():
    base = RunConfig()
    fields = [f for f in describe(base) if not isinstance(f.value, (bytes, bytearray)) and f.type_name != "bytes | None"]
    assert len(fields) > 150
    for field in fields:
        config = apply_overrides(base, [f"{field.path}={_text(field.value)}"])
        assert _get(config, field.path) == field.value, field.path


@pytest.mark.parametrize("old", EARLIER_PATHS)
def test_paths_of_earlier_releases_still_reach_their_field(old):
    new = current_path(RunConfig, old)
    value = _get(RunConfig(), new)
    changed = apply_overrides(RunConfig(), [f"{old}={_text(value)}"])
    assert _get(changed, new) == value


def test_a_config_json_of_an_earlier_release_is_read_into_the_new_layout():
    old = {"trainer": {"lr": 0.25, "gather_bucket_mb": 8, "world_size": 3},
           "rollout": {"engine": {"num_blocks": 32}, "sglang_tp_size": 2, "policy": "reference",
                       "emulated_preemptible_speed": 0.5},
           "task": {"math_path": "gsm8k.jsonl", "math_answer_format": "gsm8k"}}
    config = from_dict(RunConfig, old)
    assert (config.trainer.optimizer.lr, config.trainer.sharding.gather_bucket_mb, config.trainer.world_size) == (
        0.25, 8, 3)
    assert config.rollout.embedded.num_blocks == 32 and config.rollout.sglang.tp_size == 2
    assert config.controller.window.policy == "reference" and config.rollout.emulated.preemptible_speed == 0.5
    assert config.task.math.path == "gsm8k.jsonl" and config.task.math.answer_format == "gsm8k"
    assert from_dict(RunConfig, to_dict(config)) == config


def test_every_field_says_what_it_means():
    missing = [f.path for f in describe(RunConfig()) if not f.meaning]
    assert missing == []


def test_sections_are_the_components_own_configs():
    """RunConfig holds component configs whole: no section repeats another's fields."""
    from rlboost.trainer.config import FSDPConfig, OptimizerConfig

    trainer = RunConfig().trainer
    assert isinstance(trainer.optimizer, OptimizerConfig) and isinstance(trainer.sharding, FSDPConfig)
    assert not {f.name for f in dataclasses.fields(trainer)} & {f.name for f in dataclasses.fields(OptimizerConfig)}
