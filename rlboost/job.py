"""`rlboost train`: streaming GRPO with rollout offloaded to preemptible instances.

Each step: the reserved engines (and whatever preemptible instances are up) roll out the
step's prompt groups with weight version k; the trainer trains on complete groups as they
arrive, steps the optimizer, and publishes version k+1, which every instance pulls.
"""

from __future__ import annotations

from pathlib import Path

from rlboost.cluster.session import RaySession, join_address
from rlboost.migration.state import SamplingParams
from rlboost.models import ModelConfig
from rlboost.recipes.checkpoints import prepare_checkpoint
from rlboost.recipes.config import RunConfig, TaskSection, check_multi_node
from rlboost.recipes.tokenizers import load_tokenizer
from rlboost.cluster.cost import CostLedger
from rlboost.launch import Cluster, plan_trace, ray_settings
from rlboost.report import write_report
from rlboost.rundir import RunDirectory
from rlboost.runtime import (Phases, StepProgress, StopSignal, checkpoint_state, open_run, resume_weights,
                             save_checkpoint, step_record)
from rlboost.tasks.arithmetic import ArithmeticTask
from rlboost.tasks.dataset import MathDatasetConfig, MathTask
from rlboost.trainer.feed import TaskFeed
from rlboost.trainer.loop import train_streaming


def preflight(config: RunConfig) -> None:
    """Checks that need the environment, not just the config: ValueError naming the field."""
    if join_address(config.cluster.address):  # from the config or the environment
        check_multi_node(config)


def train(config: RunConfig, *, resume: str | None = None) -> RunDirectory:
    """Run (or resume) a training run; returns its run directory."""
    preflight(config)  # refused before anything starts
    run, first = open_run(config, resume)
    state = checkpoint_state(run, first)
    start = prepare_checkpoint(config.model, config.task)  # built and cached once
    feed = task_feed(config.task, start)
    weights, optimizer_state = resume_weights(run, start, first)
    plan = plan_trace(config, config.run.steps - first + 1, step_s=1.0)  # sizes Ray's resources
    ledger = CostLedger(config.cost)
    ledger.carry(state.get("ledger", {}))  # costs of the launches before this resume
    with StopSignal() as stop, RaySession(ray_settings(config, plan)):
        cluster = Cluster(config, run, ledger, weights=weights, reference=start,
                          optimizer_state=optimizer_state)
        progress = StepProgress(first, config.run.steps, config.run.progress)
        try:
            cluster.begin(version=first)
            if state.get("trace"):  # resumed: the trace goes on from where the checkpoint left it
                saved = state["trace"]
                cluster.replay_trace(plan_trace(config, 0, 0.0, duration_s=saved["duration_s"]),
                                     offset_s=saved["offset_s"])
            for step in range(first, config.run.steps + 1):
                record = train_step(cluster, feed, step, config)
                run.append_metrics(record)
                progress.update(record)
                if cluster.replay is None:  # paced by the first step, so it fits the run
                    cluster.replay_trace(plan_trace(config, config.run.steps - step, record["step_wall_s"]))
                if step % config.run.checkpoint_every == 0 or step == config.run.steps or stop.requested:
                    save_checkpoint(cluster, run, step, start)
                if stop.requested:
                    break
        finally:
            progress.close()
            cluster.close()
    write_report(run, echo=config.run.progress)
    return run


def train_step(cluster: Cluster, feed: TaskFeed, step: int, config: RunConfig) -> dict:
    """One step with weight version `step`; publishes version step + 1."""
    phases = Phases()
    with phases("pull"):  # the reserved engines load the version this step samples from
        cluster.wait_for_weights(step)
    with phases("rollout"):  # the local window: reserved engines roll out, then hand over
        cluster.start_rollout(step, feed.groups(step))
        cluster.wait_window_closed()
    with phases("train"):  # micro-batches of complete groups, as they arrive
        outcome = train_streaming(
            cluster.trainer, cluster.next_microbatch, feed.score, version=step,
            group_size=config.task.group_size, pad_id=feed.tokenizer.pad_id, grpo=config.grpo,
            timeout_s=config.run.microbatch_timeout_s)
    rollout = cluster.end_rollout()
    with phases("publish"):  # gathered bucket by bucket into the staging area, then served
        published = cluster.publish(step + 1)
    pulls = cluster.fleet.pull_records(step)
    return step_record(step, outcome, rollout, phases, pulls, published, cluster.fleet.up(),
                       cluster.ledger, cluster.run.elapsed(), feed.describe(outcome.example))


def task_feed(task: TaskSection, checkpoint: Path) -> TaskFeed:
    """The task's prompts as token ids for the checkpoint's tokenizer, with its stop tokens."""
    tokenizer = load_tokenizer(checkpoint)
    stops = {tokenizer.eos_id, *ModelConfig.load(checkpoint).eos_token_ids}
    params = SamplingParams(temperature=task.temperature, top_p=task.top_p,
                            max_new_tokens=task.max_new_tokens, stop_token_ids=tuple(sorted(stops)))
    template = task.prompt_template
    if task.name == "arithmetic":
        source = ArithmeticTask(task.arithmetic)
    else:  # the dataset applies the template itself
        template = "{prompt}"
        source = MathTask.from_file(MathDatasetConfig(
            path=task.math_path, prompt_field=task.math_prompt_field, answer_field=task.math_answer_field,
            answer_format=task.math_answer_format, prompt_template=task.prompt_template))
    return TaskFeed(source, tokenizer, groups_per_step=task.groups_per_step, group_size=task.group_size,
                    params=params, prompt_template=template, chat_template=task.chat_template,
                    extract_answer=task.answer == "extract", seed=task.seed)
