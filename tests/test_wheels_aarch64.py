"""Every runtime dependency installs on a Coral Dev Board from prebuilt wheels.

pip resolves edgecap's runtime requirements (pyproject's [project].dependencies and
the `service` extra) for CPython 3.9 and 3.11 on manylinux aarch64 with
--only-binary=:all:, in --dry-run mode (it fetches metadata, not the wheels, where
the index serves it). A requirement with no wheel fails the resolution; every
resolved item must be a wheel whose tags the board accepts.

The board: Mendel Linux 4/5 is Debian 10 "buster", glibc 2.28, so manylinux_2_17 up
to manylinux_2_28 wheels load there. pip does not widen --platform by itself (a
manylinux2014_aarch64 platform does not even accept a wheel tagged only
manylinux_2_17_aarch64, which is how ai-edge-litert 1.x is tagged), so each tag is
passed explicitly.

pip evaluates environment markers against the interpreter running it, not the
target; the test evaluates them for the target (packaging.markers) and checks the
resolution's closure, adding what pip left out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

packaging_markers = pytest.importorskip("packaging.markers")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name, parse_wheel_filename  # noqa: E402

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parent.parent
BOARD_GLIBC_MINOR = 28  # Debian 10 buster (Mendel 4 "Day", Mendel 5 "Eagle")
PLATFORMS = [f"manylinux_2_{minor}_aarch64" for minor in range(17, BOARD_GLIBC_MINOR + 1)]
PLATFORMS.append("manylinux2014_aarch64")  # the legacy alias of manylinux_2_17
PYTHONS = ("3.9", "3.11")


def load_pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.9 and 3.10
        tomllib = pytest.importorskip("tomli")
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def runtime_requirements() -> Tuple[List[str], bool]:
    """Returns the runtime requirement strings and whether a `service` extra exists."""
    project = load_pyproject()["project"]
    extras = project.get("optional-dependencies", {})
    return list(project["dependencies"]) + list(extras.get("service", [])), "service" in extras


def target_environment(python: str) -> Dict[str, str]:
    """The PEP 508 marker environment of CPython `python` on aarch64 Linux."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": "aarch64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
        "extra": "",
    }


def applies(req: Requirement, env: Dict[str, str], extras: Set[str] = frozenset()) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(dict(env, extra=e)) for e in (set(extras) | {""}))


def unmarked(req: Requirement) -> str:
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def pip_resolve(requirements: List[str], python: str, workdir: Path) -> dict:
    """Runs pip's dry-run resolution for CPython `python` on the board; returns its report."""
    report = workdir / f"report-{python}.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--only-binary=:all:", "--implementation", "cp",
           "--python-version", python, "--target", str(workdir / f"target-{python}"),
           "--report", str(report)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    proc = subprocess.run(cmd + requirements, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if "is ignored" not in line]
        pytest.fail(f"Python {python} aarch64: no wheel-only resolution of {requirements}:\n"
                    + "\n".join(lines[-15:]))
    return json.loads(report.read_text())


def resolve_closed(requirements: List[str], python: str, workdir: Path) -> List[dict]:
    """Resolves until every requirement that applies on the target is in the resolution."""
    env = target_environment(python)
    wanted = [unmarked(r) for r in map(Requirement, requirements) if applies(r, env)]
    for _ in range(4):
        items = pip_resolve(wanted, python, workdir)["install"]
        have = {canonicalize_name(i["metadata"]["name"]) for i in items}
        missing = []
        for item in items:
            extras = set(item.get("requested_extras") or ())
            for text in item["metadata"].get("requires_dist") or ():
                req = Requirement(text)
                if applies(req, env, extras) and canonicalize_name(req.name) not in have:
                    missing.append(unmarked(req))
        if not missing:
            return items
        wanted += missing
    pytest.fail(f"Python {python}: the resolution never closed; still missing {missing}")


@pytest.fixture(scope="module")
def index_reachable():
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "pip", "--disable-pip-version-check"],
        capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0:
        pytest.skip("package index unreachable (pip index versions pip failed): "
                    + (proc.stderr.strip().splitlines() or ["no output"])[-1])


@pytest.mark.parametrize("python", PYTHONS)
def test_runtime_dependencies_are_prebuilt_aarch64_wheels(python, index_reachable, tmp_path):
    requirements, has_service = runtime_requirements()
    items = resolve_closed(requirements, python, tmp_path)
    accepted = set(PLATFORMS) | {"any"}
    interpreters = {f"cp{python.replace('.', '')}", "py3", f"py{python.replace('.', '')}",
                    "py2.py3", "cp3"}
    rows = []
    for item in items:
        url = item["download_info"]["url"]
        filename = url.rsplit("/", 1)[-1]
        assert filename.endswith(".whl"), f"{filename}: not a wheel, pip would build it on the board"
        _, _, _, tags = parse_wheel_filename(filename)
        assert any(t.platform in accepted for t in tags), f"{filename}: no tag the board accepts"
        assert any(t.interpreter in interpreters or t.abi == "abi3" for t in tags), filename
        rows.append(f"  {item['metadata']['name']} {item['metadata']['version']}: {filename}")
    names = {canonicalize_name(i["metadata"]["name"]) for i in items}
    env = target_environment(python)
    for req in map(Requirement, requirements):
        if applies(req, env):
            assert canonicalize_name(req.name) in names, req.name
    extra = "with" if has_service else "no `service` extra in pyproject.toml,"
    print(f"\nPython {python}, manylinux_2_17..2_{BOARD_GLIBC_MINOR} aarch64, {extra} "
          f"{len(requirements)} requirements:\n" + "\n".join(rows))
