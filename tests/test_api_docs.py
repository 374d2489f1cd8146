"""The API reference: pdoc builds it from the public face's docstrings, and no reference in them is broken.

``make docs-api`` writes the same pages to build/api/ (the Makefile's pdoc line
is checked against ``MODULES`` and ``DOCFORMAT`` below). A docstring reference
is a code span naming something by a dotted path (``edgecap.planner.Choice``,
``Caption.confidence``) or an entry of a ``Raises:`` section: each must name
what exists, so that a rename or a move that leaves a docstring behind fails
here instead of misleading a reader.
"""

from __future__ import annotations

import builtins
import importlib
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pdoc
import pdoc.doc
import pdoc.render
import pytest

import edgecap

REPO = Path(__file__).resolve().parent.parent
# What the reference covers: the public face (edgecap's __all__, each name with its members).
MODULES = ("edgecap",)
DOCFORMAT = "google"

_SPAN = re.compile(r"``([^`]+)``|`([^`]+)`")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_ENTRY = re.compile(r"([A-Za-z_][\w.]*)\s*:")


def _member(obj: Any, name: str) -> Tuple[bool, Any]:
    """Whether ``obj`` has ``name`` (a dataclass or msgspec field without a default counts), and its value."""
    try:
        return True, getattr(obj, name)
    except AttributeError:
        pass
    for klass in getattr(obj, "__mro__", ()):
        if name in getattr(klass, "__annotations__", {}) or name in getattr(klass, "__struct_fields__", ()):
            return True, None  # a field: its type is not followed further
    return False, None


def _resolves(parts: List[str], start: Any) -> bool:
    obj = start
    for name in parts:
        if obj is None:
            return True
        found, obj = _member(obj, name)
        if not found:
            return False
    return True


def _import_prefix(parts: List[str]) -> Tuple[Optional[ModuleType], List[str]]:
    """The longest importable module of a dotted path, and the rest of the path."""
    for n in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:n])), parts[n:]
        except ImportError:
            continue
    return None, parts


def _dotted_resolves(text: str, namespace: Dict[str, Any]) -> Optional[bool]:
    """Whether a dotted reference names something; None where it is not one of edgecap's."""
    parts = text.split(".")
    if parts[0] in ("edgecap", "edgecap_compile"):
        module, rest = _import_prefix(parts)
        return module is not None and _resolves(rest, module)
    if parts[0] in namespace:
        return _resolves(parts[1:], namespace[parts[0]])
    return None  # prose in code marks (a file name, a key of a document): not a reference


def _raises(docstring: str) -> Iterator[str]:
    """The names a Google-style ``Raises:`` section lists."""
    lines = iter(docstring.splitlines())
    for line in lines:
        if line.strip() != "Raises:":
            continue
        entry_depth = None
        for inner in lines:
            if not inner.strip():
                continue
            depth = len(inner) - len(inner.lstrip())
            if depth <= len(line) - len(line.lstrip()):
                break
            entry_depth = depth if entry_depth is None else entry_depth
            match = _ENTRY.match(inner.strip())
            if depth == entry_depth and match:
                yield match.group(1)


def _documented(doc: pdoc.doc.Doc) -> Iterator[pdoc.doc.Doc]:
    yield doc
    if isinstance(doc, pdoc.doc.Class):
        for member in doc.own_members:
            yield from _documented(member)
    elif isinstance(doc, pdoc.doc.Module):
        for member in doc.members.values():
            yield from _documented(member)


def broken_references(modules: Tuple[str, ...]) -> List[str]:
    """Every docstring reference in the documentation of ``modules`` that names nothing, as ``where: what``."""
    face = {name: getattr(edgecap, name) for name in edgecap.__all__}
    broken = []
    for name in modules:
        for doc in _documented(pdoc.doc.Module.from_name(name)):
            home = sys.modules.get(doc.taken_from[0])
            namespace = {**vars(builtins), **face, **(vars(home) if home else {})}
            for span in _SPAN.finditer(doc.docstring):
                text = (span.group(1) or span.group(2)).strip().removesuffix("()")
                if _DOTTED.fullmatch(text) and _dotted_resolves(text, namespace) is False:
                    broken.append(f"{doc.fullname}: {text}")
            for raised in _raises(doc.docstring):
                if _dotted_resolves(raised, namespace) is False or ("." not in raised
                                                                    and raised not in namespace):
                    broken.append(f"{doc.fullname}: Raises {raised}")
    return broken


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The API reference as ``make docs-api`` builds it, in a temp dir; pdoc's warnings fail the build."""
    out = tmp_path_factory.mktemp("api")
    pdoc.render.configure(docformat=DOCFORMAT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pdoc warns of a name it cannot import or a docstring it cannot parse
        pdoc.pdoc(*MODULES, output_directory=out)
    return out


def test_the_reference_documents_every_public_name_with_its_members(reference: Path) -> None:
    page = (reference / "edgecap.html").read_text()
    for name in edgecap.__all__:
        assert f'<section id="{name}">' in page, name
    for member in ("EdgeCaptioner.stream", "EdgeCaptioner.events", "EdgeCaptioner.stats", "Caption.text",
                   "CaptionerOptions.board", "Bundle.window", "DeviceFailed.device"):
        assert f'id="{member}"' in page, member
    assert (reference / "index.html").is_file() and (reference / "search.js").is_file()


def test_no_docstring_reference_of_the_reference_is_broken(reference: Path) -> None:
    broken = broken_references(MODULES)
    assert not broken, "docstring references to nothing:\n" + "\n".join(broken)


def test_a_broken_reference_is_found_and_a_sound_one_is_not(tmp_path, monkeypatch) -> None:
    (tmp_path / "api_docs_probe.py").write_text('''
"""Refers to ``edgecap.captioner.Caption`` and ``edgecap.captioner.Caption.text`` (a field with no default)."""

from edgecap.captioner import Caption


def sound():
    """Reads ``Caption.confidence``, ``edgecap.options.CaptionerOptions.board`` and ``plans/<board>``.

    Raises:
      BundleError: If ... (a public name).
      ValueError: If ... (a builtin).
    """


def stale():
    """Reads ``edgecap.captioner.Captions``, ``Caption.confidense`` and ``edgecap.no_such_module.X``.

    Raises:
      BundleErorr: If the bundle is bad.
        SomethingElse: an indented line of the entry above, not an entry.
    """
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert broken_references(("api_docs_probe",)) == [
        "api_docs_probe.stale: edgecap.captioner.Captions",
        "api_docs_probe.stale: Caption.confidense",
        "api_docs_probe.stale: edgecap.no_such_module.X",
        "api_docs_probe.stale: Raises BundleErorr",
    ]


def test_make_docs_api_builds_what_this_file_checks() -> None:
    recipe = [line.strip() for line in (REPO / "Makefile").read_text().splitlines() if "-m pdoc" in line]
    assert recipe == [f".venv-test/bin/python -m pdoc -d {DOCFORMAT} -o build/api {' '.join(MODULES)}"]
