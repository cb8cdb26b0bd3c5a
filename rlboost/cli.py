"""The `rlboost` command line: train, report, info."""

from __future__ import annotations

import argparse
import sys


def _info(_args: argparse.Namespace) -> int:
    from rlboost import __version__, _C

    print(f"rlboost {__version__}: HAS_UCX={_C.HAS_UCX} HAS_CUDA={_C.HAS_CUDA}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from rlboost.job import preflight, train

    try:
        config = _run_config(args)
        preflight(config)
    except (ValueError, FileNotFoundError) as exc:  # a bad recipe, --set, run directory or cluster
        print(f"rlboost train: {exc}", file=sys.stderr)
        return 2

    try:
        run = train(config, resume=args.resume)
    except KeyboardInterrupt:
        print("stopped; resume from the last checkpoint with --resume RUN_DIR", file=sys.stderr)
        return 130
    print(run.path)
    return 0


def _run_config(args: argparse.Namespace):
    from rlboost.recipes import DEFAULT_RECIPE, get_recipe
    from rlboost.recipes.overrides import apply_overrides

    if args.resume is not None:
        if args.recipe is not None:
            raise ValueError("--resume continues a run with its own config; do not give --recipe too")
        from rlboost.runtime import read_run_config

        config = read_run_config(args.resume)
    else:
        config = get_recipe(args.recipe or DEFAULT_RECIPE)
    return apply_overrides(config, args.set)


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlboost.report import write_report
    from rlboost.rundir import METRICS_FILE, RunDirectory

    if not (Path(args.run_dir) / METRICS_FILE).is_file():
        print(f"rlboost report: {args.run_dir} is not a run directory with metrics", file=sys.stderr)
        return 2
    write_report(RunDirectory(args.run_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlboost", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print what the native core was built with")
    info.set_defaults(func=_info)
    train = sub.add_parser("train", help="streaming GRPO with preemptible rollout instances",
                           description="Train with a recipe (default tiny_cpu); the run directory goes "
                                       "under RLBOOST_RUN_ROOT (default ./runs).")
    train.add_argument("--recipe", help="tiny_cpu (default), smollm2_cpu or qwen3_gpu")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. --set run.steps=10 (repeatable)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    train.set_defaults(func=_train)
    report = sub.add_parser("report", help="redraw a run's plots and print its summary")
    report.add_argument("run_dir", metavar="RUN_DIR")
    report.set_defaults(func=_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
