"""A summary's rows as a table on a terminal or a stream (rich), readable either way: a
stream that is not a terminal (a pipe, a file) gets wide lines, so paths and figures are
never broken at 80 columns; text from a run's files is escaped and never read as markup."""

from __future__ import annotations

from typing import TextIO

from rlboost.inputs import printable


def print_table(rows: list[tuple[str, str]], title: str, file: TextIO) -> None:
    from rich.table import Table

    table = Table(title=rich_text(title), show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(rich_text(key), rich_text(value))
    console(file).print(table)


def console(file: TextIO):
    """A rich console on `file`; one that is not a terminal is given room (200 columns)."""
    from rich.console import Console

    terminal = hasattr(file, "isatty") and file.isatty()
    return Console(file=file, width=None if terminal else 200, soft_wrap=not terminal)


def rich_text(value: object):
    from rich.text import Text

    return Text(printable(value))  # Text, not str: rich would read [...] in a run's own strings as markup
