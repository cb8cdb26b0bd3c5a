"""The README is a newcomer's first page and stays one: short, the set-up and test commands
on its first screen, every link to a guide or a results file resolving, and every row of
the benchmark table dated with its year, its load and a results file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_COMMAND = "pip install torch==2.13.0 . && rlboost train"
TEST_COMMAND = "pip install torch==2.13.0 -e '.[test]' && python -m pytest"


def test_the_readme_is_short_and_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 250
    first_screen = "\n".join(lines[:40])
    assert RUN_COMMAND in first_screen and TEST_COMMAND in first_screen


def test_every_local_link_of_the_readme_and_the_guides_resolves():
    for page in [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which is not there"


def test_every_benchmark_row_names_its_date_load_and_results_file():
    rows = [line for line in (ROOT / "bench" / "README.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| figure", "|---"))]
    assert len(rows) >= 20
    last_file = None
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        figure, date, load, results = cells[0], cells[-3], cells[-2], cells[-1]
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", date), (figure, date)
        assert load, figure
        link = re.search(r"\((results/[^)]+)\)", results)
        if link:
            last_file = link.group(1)
        assert results == "same" and last_file or link, f"{figure}: no results file"
        assert (ROOT / "bench" / last_file).is_file(), last_file
