"""results/README.md indexes every benchmark output: each file in results/ has its row, each row a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

RESULTS = Path(__file__).resolve().parent.parent / "results"
DOCS = RESULTS.parent / "docs"


def _rows() -> list:
    return [line for line in (RESULTS / "README.md").read_text().splitlines()
            if line.startswith("| [")]


def test_every_result_file_has_a_row_and_every_row_names_files_that_exist() -> None:
    linked = {name for row in _rows() for name in re.findall(r"\]\(([^)/]+)\)", row.split(" | ")[0])}
    on_disk = {p.name for p in RESULTS.iterdir()} - {"README.md"}
    assert on_disk - linked == set(), "results without a row in results/README.md"
    assert linked - on_disk == set(), "rows of results/README.md naming no file"


def test_every_row_says_what_command_when_and_measured_or_modelled() -> None:
    for row in _rows():
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 5, row
        _, what, command, date, kind = cells
        assert what and command, row
        assert re.match(r"20\d\d-\d\d-\d\d", date), row
        assert "measured" in kind or "modelled" in kind, row


def test_docs_holds_no_result_file() -> None:
    results = sorted(p.name for p in DOCS.iterdir() if p.suffix == ".json")
    assert not results, f"result files in docs/ (they go to results/): {results}"
