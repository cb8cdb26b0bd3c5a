"""The `rlboost` command line: train, simulate, config, plan, report, info, notice.

Every expected failure prints one or two lines saying what is wrong and what to do, and
exits with a documented code (2 bad input, 3 the run failed, 130 interrupted); a traceback
appears only for a bug, or with --debug (before the line, with the same exit code).
"""

from __future__ import annotations

import argparse
import gc
import sys
import traceback

from rlboost.inputs import printable
from rlboost.run.outcome import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK

# what a user can fix: bad values, missing or damaged files, a missing optional package
_BAD_INPUT = (ValueError, OSError, ModuleNotFoundError)
# Named here rather than imported (the recipes import torch; `rlboost notice` starts in well
# under a second); tests/test_newcomer.py checks them against rlboost.recipes and the scenarios.
RECIPES = ("tiny_cpu", "tiny_vllm_cpu", "smollm2_cpu", "tiny_calculator_cpu", "qwen3_gpu", "paper_qwen3_8b",
           "paper_qwen3_14b", "paper_qwen3_32b")
RECIPE_HELP = ("tiny_cpu (default: a tiny model learns sums on a CPU), tiny_vllm_cpu (the same on vLLM's CPU build), "
               "smollm2_cpu (a real 135M model), tiny_calculator_cpu (multi-turn episodes with a calculator tool), "
               "qwen3_gpu (a GPU run with SGLang), paper_qwen3_8b (the RLBoost artifact's Qwen3-8B run, emulated), "
               "paper_qwen3_14b and paper_qwen3_32b (the paper's larger models, same setup)")
SCENARIOS = ("paper", "paper-trace", "paper-trace-reference", "artifact", "saturation", "sweep", "sweep-14b",
             "sweep-32b")


def _info(_args: argparse.Namespace) -> int:
    from rlboost import _C, __version__

    print(f"rlboost {__version__}: HAS_UCX={_C.HAS_UCX} HAS_CUDA={_C.HAS_CUDA} HAS_AEAD={_C.HAS_AEAD}")
    return EXIT_OK


def _config(args: argparse.Namespace) -> int:
    from rlboost.config.describe import describe, format_table

    print(format_table(list(describe(_run_config(args)))))
    return EXIT_OK


def _train(args: argparse.Namespace) -> int:
    from rlboost.errors import ConfigError, RunHalted
    from rlboost.run.job import preflight, train
    from rlboost.run.outcome import ending_lines, exit_code, stopped_lines

    started = []  # train() says when the run's processes start: an error after that is the run's
    try:
        config = _run_config(args)
        preflight(config)
        result = train(config, resume=args.resume, quiet=not args.debug, on_start=lambda: started.append(True))
    except RunHalted as exc:
        if args.debug:
            traceback.print_exc()
        _say(*ending_lines(exc))
        return exit_code(exc)
    except _BAD_INPUT as exc:
        if started and not isinstance(exc, ConfigError):
            raise  # raised inside a started run, where rlboost expects none of these: a bug
        return _bad_input(args, exc)
    if result.stopped:
        _say(*stopped_lines(result))
        return EXIT_INTERRUPTED
    print(result.run.path)
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    from rlboost.run.plan import header, run_memory_plan

    config = _run_config(args)
    plan = run_memory_plan(config, gpu=args.gpu)
    print(header(config, plan))
    print(plan.table())
    return EXIT_OK


def _run_config(args: argparse.Namespace):
    from rlboost import env
    from rlboost.config.overrides import apply_overrides
    from rlboost.recipes import DEFAULT_RECIPE, get_recipe

    if getattr(args, "resume", None) is not None:
        if args.recipe is not None:
            raise ValueError("--resume continues a run with its own config; do not give --recipe too")
        from rlboost.run.checkpoints import read_run_config

        config = read_run_config(args.resume)
    else:
        config = get_recipe(args.recipe or DEFAULT_RECIPE)
    return apply_overrides(config, [*args.set, *env.extra_overrides()])


def _simulate(args: argparse.Namespace) -> int:
    from rlboost import env
    from rlboost.run.simulate import calibrate_paper, simulate

    if args.calibrate:
        calibrate_paper()
        return EXIT_OK
    print(simulate(args.scenario, [*args.set, *env.extra_overrides()], steps=args.steps, progress=not args.quiet))
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlboost.run.directory import METRICS_FILE, RunDirectory
    from rlboost.run.report import report_directory

    if not (Path(args.run_dir) / METRICS_FILE).is_file():
        raise FileNotFoundError(f"{args.run_dir} is not a run directory with metrics ({METRICS_FILE})")
    try:
        report_directory(RunDirectory(args.run_dir), sys.stdout)
    except (TypeError, KeyError, AttributeError, IndexError) as exc:  # a line of the wrong shape
        raise ValueError(f"{args.run_dir}: its metrics or events hold values of a kind rlboost does not write "
                         f"({type(exc).__name__}: {exc}); --debug shows where") from exc
    return EXIT_OK


def _notice(args: argparse.Namespace) -> int:
    """Announce that this node goes away in --grace seconds (a shutdown hook's one line).
    Exit 0 only when the run took the notice (and, with --wait, drained the node)."""
    import time

    from rlboost.cluster.notices.hook import pick_socket, send_notice
    from rlboost.run.outcome import EXIT_RUN_FAILED

    if not 0 <= args.grace <= 86400:
        raise ValueError(f"--grace must be in [0, 86400] seconds, got {args.grace:g}")
    path = pick_socket(args.dir, args.node)
    t0 = time.monotonic()
    try:
        answer = send_notice(path, args.grace, wait=args.wait)
    except PermissionError:
        raise
    except OSError as exc:
        raise ValueError(f"the run's notice agent at {path} did not answer ({exc}); is the run still up?") from None
    node = path.stem
    if answer.get("taken") is not True:
        _say(f"rlboost notice: node {node}: {answer.get('error', 'the run did not take the notice')}")
        return EXIT_RUN_FAILED
    line = f"node {node} goes in {args.grace:g} s: the run took the notice in {time.monotonic() - t0:.2f} s"
    if args.wait and answer.get("drained") is not True:
        _say(f"rlboost notice: {line}; its instances were not drained within the grace")
        return EXIT_RUN_FAILED
    if args.wait:
        line += f"; drained after {time.monotonic() - t0:.1f} s"
    print(line)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks of expected failures too")
    from rlboost import __version__

    parser = argparse.ArgumentParser(prog="rlboost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rlboost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", parents=[common], help="print what the native core was built with")
    info.set_defaults(func=_info)
    for name, func, helptext in (
            ("train", _train, "streaming GRPO with preemptible rollout instances"),
            ("config", _config, "list every config field with its value, type and meaning")):
        cmd = sub.add_parser(name, parents=[common], help=helptext, description=helptext + f". Recipes: {RECIPE_HELP}. "
                             "Extra --set assignments may come from RLBOOST_SET; run directories go under "
                             "RLBOOST_RUN_ROOT (./runs).")
        cmd.add_argument("--recipe", help=", ".join(RECIPES))
        cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config field, e.g. --set run.steps=10 (repeatable; "
                              "`rlboost config` lists the fields)")
        cmd.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint"
                         if name == "train" else "show the config of a run directory")
        cmd.set_defaults(func=func)
    plan = sub.add_parser("plan", parents=[common], help="the trainer's memory per rank, term by term",
                          description="Print the trainer's memory plan per rank (parameters, gradients, optimizer "
                          "state, activations, logits, NCCL, a colocated engine) against a GPU's memory.")
    plan.add_argument("--recipe", help=", ".join(RECIPES))
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    plan.add_argument("--gpu", help="plan for this GPU kind (default trainer.gpu): h100-sxm, h200, a100-sxm-80gb")
    plan.set_defaults(func=_plan)
    sim = sub.add_parser("simulate", parents=[common], help="a named scenario through the discrete-event simulator",
                         description=f"Simulate a scenario ({', '.join(SCENARIOS)}; the sweeps print a spot plan of "
                         "tokens/s and tokens per $ against the instance count and the spot discount) with the "
                         "controller's own policies and the timing model; writes a run directory.")
    sim.add_argument("--scenario", default="paper", help=f"{', '.join(SCENARIOS)} (default paper)")
    sim.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    sim.add_argument("--steps", type=int, default=None, help="steps to simulate, at least 2 (default: the scenario's)")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.add_argument("--calibrate", action="store_true",
                     help="check the timing model against verl's reserved-only baseline and print the gap")
    sim.set_defaults(func=_simulate)
    notice = sub.add_parser("notice", parents=[common], help="tell the run that this node goes away soon",
                            description="Run by a node's shutdown hook (Kubernetes preStop, systemd, cloud-init): the "
                            "run drains this node's rollout instances before the grace ends.")
    notice.add_argument("--grace", type=float, default=30.0, metavar="S", help="seconds until the node goes (default 30)")
    notice.add_argument("--wait", action="store_true", help="return once the node's instances have drained (exit 3 "
                        "when they have not within the grace)")
    notice.add_argument("--node", metavar="ID", help="the Ray node (id prefix) when several share this machine")
    notice.add_argument("--dir", metavar="DIR", help="the nodes' notice sockets, as the run's cluster.notices.hook_dir "
                        "(default: the user's runtime folder, else rlboost-notices-UID in the temporary folder)")
    notice.set_defaults(func=_notice)
    report = sub.add_parser("report", parents=[common], help="redraw a run's plots and print its summary")
    report.add_argument("run_dir", metavar="RUN_DIR")
    report.set_defaults(func=_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The one boundary where every expected error becomes its line and exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.func is _train:  # tells bad input from a bug itself: the run may have started
            return _train(args)
        try:
            return args.func(args)
        except _BAD_INPUT as exc:
            return _bad_input(args, exc)
    except KeyboardInterrupt:  # before the run started (or outside train)
        if args.debug:
            traceback.print_exc()
        _say(f"rlboost {args.command}: interrupted")
        return EXIT_INTERRUPTED


def _bad_input(args: argparse.Namespace, exc: BaseException) -> int:
    """The one line of an expected error (its traceback first with --debug), exit code 2."""
    if args.debug:
        traceback.print_exception(exc)
    _say(f"rlboost {args.command}: {_one_line(exc)}")
    return EXIT_BAD_INPUT


def _one_line(exc: BaseException) -> str:
    text = printable(" ".join(str(exc).split()))  # file names and values may come from a handed-over file
    if isinstance(exc, ModuleNotFoundError) and "pip install" not in text:
        text += f" (install it: pip install {exc.name})" if exc.name else ""
    return text or type(exc).__name__


def _say(*lines: str) -> None:
    for line in lines:
        print(printable(line), file=sys.stderr, flush=True)


def command() -> None:
    """The `rlboost` program: main(), then exit without sweeping the heap. Interpreter
    shutdown's garbage collection walks every object torch, Ray and transformers made (2-4 s
    on a 2-core machine after a run) to free memory the system takes back anyway; frozen,
    objects are still freed by reference counting, their finalizers and atexit hooks run."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    command()
