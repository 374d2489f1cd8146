"""The README runs as written: its python snippets and its `edgecap ...` commands.

So do the pages that hold the README's longer tour (``PAGES``: the guide, the
models, the install). Every `edgecap` line of a ```sh block must parse with the
CLI; those that need no TensorFlow, camera, dataset or TPU also run, in page
order, in one working directory where ``models/`` is the repository's (so
``models/demo/...`` paths hold) and whatever they write lands. ```python blocks
run in that directory too. A command that cannot run here is listed in SKIP
with the reason.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import List, Tuple

import pytest

import edgecap
from edgecap.cli import build_parser, main

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# The README first: the guide's runtime snippet runs the plan its compile command writes.
PAGES = [README, REPO / "docs" / "guide.md", REPO / "docs" / "models.md", REPO / "docs" / "install.md"]

# README command (as written) -> why the suite only parses it.
SKIP = {
    "edgecap camera /dev/video0": "needs a camera",
    "edgecap serve --config deploy/edgecap.toml": "runs until stopped (tests/test_serve.py runs it)",
    "edgecap compile models/demo/bundle --board devboard-usb --into-bundle":
        "writes into the shipped bundle (tests/test_planner.py compiles into a copy)",
    "edgecap eval --data DATASET_DIR": "needs a rendered dataset (python -m models.dataset, minutes)",
    "edgecap eval --bundle my_bundle --data data/shapes_eval":
        "needs the training recipe's bundle and dataset (TensorFlow, minutes)",
    "edgecap caption --bundle ~/.cache/edgecap/bundles/resnet50-224 --board devboard-usb":
        "needs the paper-scale bundles (TensorFlow; tests/test_paper_bundles.py builds one)",
    "edgecap validate my_captioner": "needs a user's own Keras backbone and RNN",
    "edgecap compile my_captioner --board devboard-usb --into-bundle":
        "needs a user's own Keras backbone and RNN",
    "edgecap caption my_clip.mp4 --bundle my_captioner": "needs a user's own footage and bundle",
}
# README command -> options appended to keep the suite fast (argparse: the last value wins).
FAST = {
    "edgecap bench --plot bench.png": ["--frames", "8", "--profiles", "board", "--timing-only"],
    "edgecap bench --profiles board --timing-only --strides 8,4,2": ["--frames", "8"],
}


def _snippets() -> List[Tuple[str, str, str]]:
    """Returns (kind, page:line, text) of each python snippet and edgecap command, page by page, in order."""
    items = []
    for page in PAGES:
        text = page.read_text()
        where = page.relative_to(REPO).as_posix()
        for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            kind, body = block.group(1), block.group(2)
            line = text[: block.start()].count("\n") + 2
            if kind == "python":
                items.append(("python", f"{where}:{line}", body))
            elif kind == "sh":
                for i, row in enumerate(body.splitlines()):
                    command = row.split("#", 1)[0].strip()
                    if command.startswith("edgecap "):
                        items.append(("edgecap", f"{where}:{line + i}", command))
    return items


SNIPPETS = _snippets()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("readme")
    (path / "models").symlink_to(REPO / "models", target_is_directory=True)
    return path


@pytest.fixture(autouse=True)
def in_workdir(workdir, monkeypatch, tmp_path_factory):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))
    monkeypatch.delenv("EDGECAP_BUNDLE", raising=False)


def test_the_readme_has_snippets_and_every_skip_is_in_it():
    commands = {text for kind, _, text in SNIPPETS if kind == "edgecap"}
    assert sum(kind == "python" for kind, _, _ in SNIPPETS) >= 2 and len(commands) >= 10
    assert set(SKIP) <= commands and set(FAST) <= commands
    readme = [(kind, text) for kind, where, text in SNIPPETS if where.startswith("README.md:")]
    assert any(kind == "python" for kind, _ in readme) and sum(kind == "edgecap" for kind, _ in readme) >= 5


def test_the_readme_is_read_to_the_end_and_names_its_documents():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert "make demo" in text and "make test" in text
    for way in ("edgecap caption", "edgecap serve", "from edgecap import EdgeCaptioner"):
        assert way in text, way
    linked = set(re.findall(r"\]\(((?:docs|results|models)/[^)#]+)", text))
    assert linked and all((REPO / path).exists() for path in linked), linked
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README's table leaves out: {sorted(pages - linked)}"


@pytest.mark.parametrize("kind, where, text", SNIPPETS, ids=[where for _, where, _ in SNIPPETS])
def test_snippet_runs_as_written(kind, where, text, capsys):
    if kind == "python":
        if "from edgecap import EdgeCaptioner" in text and not hasattr(edgecap, "EdgeCaptioner"):
            # The public face (edgecap/__init__.py) is another change's; this runs once it is merged.
            pytest.skip("edgecap does not export EdgeCaptioner yet")
        exec(compile(text, where, "exec"), {"__name__": "__readme__"})
        return
    argv = shlex.split(text)[1:]
    build_parser().parse_args(argv)  # every command parses, skipped or not
    if text in SKIP:
        pytest.skip(SKIP[text])
    code = main(argv + FAST.get(text, []))
    assert code == 0, capsys.readouterr().err
