"""The `rlboost` command line."""

from __future__ import annotations

import argparse
import sys


def _info(_args: argparse.Namespace) -> int:
    from rlboost import __version__, _C

    print(f"rlboost {__version__}: HAS_UCX={_C.HAS_UCX} HAS_CUDA={_C.HAS_CUDA}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlboost", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print what the native core was built with")
    info.set_defaults(func=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
