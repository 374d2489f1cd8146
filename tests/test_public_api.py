"""The public face: ``from edgecap import EdgeCaptioner, ...`` works, and ``import edgecap`` stays cheap."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import edgecap

pytestmark = pytest.mark.fast

INIT = Path(edgecap.__file__)
# What the README and docs/ tell a user to import from the package itself.
PROMISED = {"EdgeCaptioner", "Caption", "Event", "CaptionerOptions", "EdgecapError", "BundleError",
            "ConfigError", "PlanError", "SourceError", "PipelineBusy", "RunCancelled", "DeviceFailed",
            "RunFailure", "StageFailed"}


def test_every_public_name_resolves_to_the_object_its_module_defines() -> None:
    assert PROMISED <= set(edgecap.__all__)
    assert len(edgecap.__all__) == len(set(edgecap.__all__))
    for name in edgecap.__all__:
        value = getattr(edgecap, name)
        home = importlib.import_module(value.__module__)
        assert getattr(home, name) is value, name
        assert home.__name__.startswith("edgecap."), f"{name} comes from {home.__name__}"


def test_from_edgecap_import_the_public_names_and_still_any_submodule() -> None:
    namespace: dict = {}
    exec("from edgecap import EdgeCaptioner, Caption, Event, CaptionerOptions, EdgecapError, faults",
         namespace)
    from edgecap.captioner import EdgeCaptioner

    assert namespace["EdgeCaptioner"] is EdgeCaptioner
    assert namespace["faults"] is importlib.import_module("edgecap.faults")
    with pytest.raises(ImportError, match="cannot import name 'NoSuchThing'"):
        exec("from edgecap import NoSuchThing", {})


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="module 'edgecap' has no attribute 'EdgeCaptoiner'"):
        edgecap.EdgeCaptoiner  # noqa: B018


def test_dir_lists_every_public_name_before_it_is_loaded() -> None:
    out = subprocess.run([sys.executable, "-c", "import edgecap, json; print(json.dumps(dir(edgecap)))"],
                         capture_output=True, text=True, check=True).stdout
    listed = json.loads(out)
    assert set(edgecap.__all__) <= set(listed)
    assert "__version__" in listed and listed == sorted(listed)


def test_the_names_type_checkers_see_are_the_public_names() -> None:
    # The TYPE_CHECKING block is what editors and mypy read in place of __getattr__.
    tree = ast.parse(INIT.read_text())
    guarded = [node for node in tree.body if isinstance(node, ast.If)
               and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
    assert len(guarded) == 1
    seen = {}
    for node in guarded[0].body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            seen[alias.name] = node.module
    assert seen == dict(edgecap._PUBLIC)


def test_import_edgecap_loads_no_submodule_and_nothing_heavy() -> None:
    code = ("import sys; before = set(sys.modules); import edgecap; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert loaded == ["edgecap"], f"import edgecap also imported {loaded}"
    # And the first public name pulls in what it needs, and only then.
    code = "import sys, edgecap; edgecap.EdgecapError; print('cv2' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
