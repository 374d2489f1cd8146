"""What an install carries and needs: the demo in the wheel, the compiler's one-line refusal, no lab.

A board installs edgecap from a wheel, not from a checkout: the wheel must carry
the demo bundle and sample clip (pyproject maps models/demo to edgecap/demo), and
where ai-edge-litert lacks ``tools.flatbuffer_utils`` (before 2.1.0, and in every
Linux aarch64 wheel) or only tflite_runtime is installed, ``import edgecap_compile``
refuses in one line while the runtime captions as before. The lab (lab/, what
measures the product) is a distribution of its own: the wheel does not carry it,
and its commands say in one line what to install.
"""

from __future__ import annotations

import fnmatch
import io
import os
import subprocess
import sys
import time
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from importlib import metadata
from pathlib import Path

import pytest

from test_wheels_aarch64 import load_pyproject

from edgecap import cli
from edgecap.bundle import DEMO_DIR, demo_dir
from edgecap_compile.errors import CompileError

REPO = Path(__file__).resolve().parent.parent




# ---------------------------------------------------------------- the demo in the wheel


def test_the_wheel_maps_every_demo_file_into_the_package() -> None:
    setuptools = load_pyproject()["tool"]["setuptools"]
    assert setuptools["package-dir"]["edgecap.demo"] == "models/demo"
    assert {"edgecap.demo", "edgecap.demo.bundle"} <= set(setuptools["packages"])
    demo = REPO / "models" / "demo"
    shipped = set()
    for package, patterns in setuptools["package-data"].items():
        if not package.startswith("edgecap.demo"):
            continue
        base = demo.joinpath(*package.split(".")[2:])
        for path in base.iterdir():
            if any(fnmatch.fnmatch(path.name, p) for p in patterns):
                shipped.add(path.relative_to(demo).as_posix())
    on_disk = {p.relative_to(demo).as_posix() for p in demo.rglob("*") if p.is_file()}
    assert on_disk - shipped == set(), "demo files the wheel would leave out"
    assert {"sample.mp4", "sample.json", "bundle/bundle.json"} <= shipped


def test_demo_dir_prefers_the_packaged_copy(tmp_path: Path) -> None:
    package = tmp_path / "site" / "edgecap"
    package.mkdir(parents=True)
    assert demo_dir(package) == tmp_path / "site" / "models" / "demo"  # a source checkout
    (package / "demo").mkdir()
    assert demo_dir(package) == package / "demo"  # a wheel install


def test_the_source_checkout_keeps_models_demo_as_the_one_copy() -> None:
    assert DEMO_DIR == REPO / "models" / "demo"
    assert not (REPO / "edgecap" / "demo").exists(), "edgecap/demo would duplicate models/demo"


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> tuple:
    """Builds the wheel as `pip install .` does (isolated build env): about 15 s; returns (wheel, log)."""
    wheels = tmp_path_factory.mktemp("wheels")
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(wheels),
                          str(REPO)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = wheels.glob("edgecap-*.whl")
    return wheel, run.stdout + run.stderr


@pytest.mark.slow
def test_wheel_ships_its_data_without_a_packages_warning(built_wheel) -> None:
    wheel, log = built_wheel
    assert "absent from the `packages` configuration" not in log
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (REPO / "compile" / "boards").glob("*.json")}
    assert shipped and {f"edgecap_compile/boards/{n}" for n in shipped} <= names
    assert "edgecap_compile/boards.py" in names
    rules = {p.name for p in (REPO / "edgecap" / "data" / "boards").glob("*.json")}
    assert rules and {f"edgecap/data/boards/{n}" for n in rules} <= names
    static = REPO / "edgecap" / "service" / "static"
    assert {f"edgecap/service/static/{p.name}" for p in static.iterdir() if p.suffix != ".py"} <= names
    demo = REPO / "models" / "demo"
    assert {f"edgecap/demo/{p.relative_to(demo).as_posix()}" for p in demo.rglob("*") if p.is_file()} <= names
    lab = sorted(n for n in names if n.startswith("edgecap_lab") or n.split("/")[-1] in LAB_FILES)
    assert not lab, f"the lab in the board's wheel: {lab}"


@pytest.mark.slow
def test_a_wheel_install_captions_the_demo_from_another_directory(built_wheel, tmp_path: Path) -> None:
    """Installs the wheel alone into a fresh venv and runs `edgecap caption` elsewhere."""
    started = time.monotonic()
    wheel, _ = built_wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                              "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    # The dependencies come from this test's environment; its site-packages holds
    # no edgecap package (the editable install is a .pth hook, which PYTHONPATH
    # does not run), so edgecap itself can only come from the wheel.
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site))
    env.pop("EDGECAP_BUNDLE", None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "from edgecap.bundle import DEMO_DIR; print(DEMO_DIR)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    run = subprocess.run([str(venv / "bin" / "edgecap"), "caption"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    captions = [line for line in run.stdout.splitlines() if line.startswith("[") and "truth:" in line]
    assert captions, run.stdout
    print(f"\n{wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB): installed and captioned "
          f"in {time.monotonic() - started:.1f} s; {captions[0]}")
    for argv in (["bench"], ["eval", "--data", str(elsewhere)]):
        run = subprocess.run([str(venv / "bin" / "edgecap"), *argv], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
        assert "pip install -e lab/" in run.stderr, run.stderr


# ---------------------------------------------------------------- the lab's door

# What measures the product and left the runtime for lab/edgecap_lab/.
LAB_FILES = {"bench.py", "soak.py", "truth_bench.py", "plots.py", "evaluate.py", "benchmark.py",
             "validity.py", "keras_zoo.py", "compile_benchmark.py", "cost_model_validity.py",
             "published.json", "truths.json", "coral_published.json"}


@pytest.fixture
def no_lab(monkeypatch):
    """Makes edgecap_lab and every module of it unimportable, as on a board (restored after)."""
    for name in [n for n in sys.modules if n.startswith("edgecap_lab.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "edgecap_lab", None)


@pytest.mark.parametrize("argv, command", [
    (["bench", "--frames", "1"], "edgecap bench"),
    (["bench", "--adapt", "--truth", ""], "edgecap bench --adapt"),
    (["eval", "--data", "."], "edgecap eval"),
])
def test_without_the_lab_its_commands_say_what_to_install_in_one_line(no_lab, argv, command) -> None:
    code, out, err = run_cli(argv)
    assert code == 2 and not out
    assert err.count("\n") == 1 and f"{command} is part of edgecap's lab" in err, err
    assert "pip install -e lab/" in err


def test_the_runtime_and_the_compiler_hold_no_lab_module() -> None:
    left = sorted(p.relative_to(REPO).as_posix() for folder in ("edgecap", "compile")
                  for p in (REPO / folder).rglob("*") if p.name in LAB_FILES)
    assert not left, f"measuring code in the runtime: {left}"


# ---------------------------------------------------------------- the compiler's needs


@pytest.fixture
def fresh_compiler(monkeypatch):
    """Forgets the imported compiler, so the next import runs its checks again (restored after).

    Its errors module stays, so that the CompileError raised is the class imported here.
    """
    for name in [n for n in sys.modules if n == "edgecap_compile" or n.startswith("edgecap_compile.")]:
        if name != "edgecap_compile.errors":
            monkeypatch.delitem(sys.modules, name)


def import_compiler():
    import importlib

    return importlib.import_module("edgecap_compile")


def test_the_compiler_refuses_in_one_line_without_flatbuffer_utils(fresh_compiler, hide_module,
                                                                   monkeypatch) -> None:
    hide_module("ai_edge_litert.tools")
    monkeypatch.setattr(metadata, "version", lambda name: "1.4.0")
    with pytest.raises(CompileError) as info:
        import_compiler()
    message = str(info.value)
    assert "\n" not in message
    assert "ai-edge-litert 1.4.0" in message and "'ai-edge-litert>=2.1'" in message


def test_the_compiler_refuses_in_one_line_with_only_tflite_runtime(fresh_compiler, hide_module,
                                                                   monkeypatch) -> None:
    def not_found(name):
        raise metadata.PackageNotFoundError(name)

    hide_module("ai_edge_litert")
    monkeypatch.setattr(metadata, "version", not_found)
    with pytest.raises(CompileError, match=r"no ai-edge-litert\) lacks"):
        import_compiler()


def test_the_compiler_imports_with_flatbuffer_utils(fresh_compiler) -> None:
    pytest.importorskip("ai_edge_litert.tools.flatbuffer_utils")
    assert callable(import_compiler().compile_model)


def run_cli(argv) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_without_the_compiler_the_runtime_captions_and_planning_says_one_line(
        fresh_compiler, hide_module, tmp_path: Path) -> None:
    hide_module("ai_edge_litert.tools")
    code, out, err = run_cli(["caption"])
    assert code == 0, err
    assert any("truth:" in line for line in out.splitlines()), out
    code, out, err = run_cli(["caption", "--board", "devboard-usb"])
    assert code == 2
    assert err.count("\n") == 1 and "flatbuffer_utils" in err, err
    code, out, err = run_cli(["compile", str(DEMO_DIR / "bundle"), "--board", "host",
                              "-o", str(tmp_path / "plan")])
    assert code == 2
    assert err.count("\n") == 1 and "compile on an x86-64 host" in err, err
