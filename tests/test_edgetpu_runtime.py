"""libedgetpu: the compatibility table, the backend rule, and the child-process probe.

The probe runs against fake libedgetpu.so.1 libraries compiled here from
tests/fake_libedgetpu/*.c: one that segfaults creating its delegate, one that
finds no device, and a working stub whose delegate leaves every op to the CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgecap import edgetpu_runtime, interpreter, stages
from edgecap.devices import parse_device
from edgecap.edgetpu_runtime import Build, identify, loads, preferred_backend
from edgecap.errors import EdgecapError

from test_planner import auto_on_a_dev_board_captions_on_the_cpu, bundle_with_plans  # noqa: F401 (a fixture)

FAKES = Path(__file__).parent / "fake_libedgetpu"
TINY = Path(__file__).parent / "data" / "compile" / "tiny_float.tflite"
BOTH = {"ai-edge-litert": "2.3.0", "tflite_runtime": "2.5.0.post1"}


@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> dict:
    """Builds each fake as .../<name>/libedgetpu.so.1 with the system C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake libedgetpu")
    root = tmp_path_factory.mktemp("fake_libedgetpu")
    built = {}
    for name in ("segfault", "no_device", "stub"):
        (root / name).mkdir()
        built[name] = root / name / "libedgetpu.so.1"
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(built[name]), str(FAKES / f"{name}.c")],
                       check=True, capture_output=True)
    return built


@pytest.fixture(autouse=True)
def fresh_cache():
    edgetpu_runtime._CACHE.clear()
    yield
    edgetpu_runtime._CACHE.clear()


def _use(monkeypatch, library: Path) -> None:
    monkeypatch.setenv(edgetpu_runtime.ENV_LIBRARY, str(library))


def test_a_library_that_segfaults_kills_the_probe_not_this_process(fakes, monkeypatch) -> None:
    _use(monkeypatch, fakes["segfault"])
    with pytest.raises(EdgecapError) as err:
        stages.load_edgetpu_delegate(parse_device("usb:0"))
    message = str(err.value)
    assert message.startswith(f"usb:0: {fakes['segfault']} crashed the probe under ")
    assert "SIGSEGV" in message and "libedgetpu/TFLite mismatch" in message
    assert "\n" not in message
    # The child read the version before it died.
    result = edgetpu_runtime.probe(str(fakes["segfault"]), "usb:0", "ai-edge-litert")
    assert result.kind == "crash"
    assert result.version.endswith("RuntimeVersion(14)")


def test_a_library_with_no_device_gives_one_line(fakes, monkeypatch) -> None:
    _use(monkeypatch, fakes["no_device"])
    with pytest.raises(EdgecapError, match=r"^usb:1: .*libedgetpu.so.1: no Edge TPU at usb:1 "
                       r"\(Failed to load delegate from .*; Failed to open device\); plug it in") as err:
        stages.load_edgetpu_delegate(parse_device("usb:1"))
    assert "\n" not in str(err.value)


def test_a_missing_library_gives_one_line(tmp_path, monkeypatch) -> None:
    _use(monkeypatch, tmp_path / "libedgetpu.so.1")
    with pytest.raises(EdgecapError, match=r"libedgetpu.so.1 not found; install the Edge TPU runtime "
                       r"\(or set EDGECAP_EDGETPU_LIBRARY\)") as err:
        stages.load_edgetpu_delegate(parse_device("usb:0"))
    assert "\n" not in str(err.value)


def test_the_stub_passes_the_probe_and_a_model_invokes_through_it(fakes, monkeypatch) -> None:
    _use(monkeypatch, fakes["stub"])
    backend = interpreter.BACKEND
    delegate = stages.load_edgetpu_delegate(parse_device("usb:0"), TINY, backend)
    interp = interpreter.make_delegate_interpreter(TINY, [delegate], backend)
    cpu = interpreter.make_cpu_interpreter(TINY)
    x = np.random.default_rng(0).standard_normal(tuple(cpu.get_input_details()[0]["shape"])).astype(np.float32)
    for i in (interp, cpu):
        i.set_tensor(i.get_input_details()[0]["index"], x)
        i.invoke()
    out = interp.get_tensor(interp.get_output_details()[0]["index"])
    np.testing.assert_array_equal(out, cpu.get_tensor(cpu.get_output_details()[0]["index"]))
    assert edgetpu_runtime.runtime_version(str(fakes["stub"])).version.startswith("BuildLabel(COMPILER=fake")


def test_the_edgetpu_runtime_command_says_what_is_installed(fakes, monkeypatch, capsys, tmp_path) -> None:
    from edgecap.cli import main

    # Only the version is read: the fake that segfaults creating a delegate still loads.
    for library, loads in ((fakes["segfault"], "ok"), (tmp_path / "absent.so.1", "no-library")):
        _use(monkeypatch, library)
        assert main(["edgetpu-runtime"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["library"] == str(library) and report["loads"] == loads, report
        assert (report["edgetpu_version"] or "").startswith("BuildLabel(COMPILER=fake") == (loads == "ok")


def test_the_probe_runs_once_per_library_and_device(fakes, monkeypatch) -> None:
    runs = []
    real = edgetpu_runtime._run_probe

    def counted(*args, **kwargs):
        runs.append(args[:2])
        return real(*args, **kwargs)

    monkeypatch.setattr(edgetpu_runtime, "_run_probe", counted)
    for device in ("usb:0", "usb:0", "usb:1", "usb:0"):
        assert edgetpu_runtime.probe(str(fakes["stub"]), device, "ai-edge-litert").ok
    assert runs == [(str(fakes["stub"]), "usb:0"), (str(fakes["stub"]), "usb:1")]
    # A library replaced on disk (a new mtime) is probed afresh.
    stat = fakes["stub"].stat()
    os.utime(fakes["stub"], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert edgetpu_runtime.probe(str(fakes["stub"]), "usb:0", "ai-edge-litert").ok
    assert len(runs) == 3


def test_a_crashing_libedgetpu_makes_auto_caption_on_the_cpu(bundle_with_plans, fakes, tmp_path,  # noqa: F811
                                                              monkeypatch, caplog) -> None:
    _use(monkeypatch, fakes["segfault"])
    logged = auto_on_a_dev_board_captions_on_the_cpu(bundle_with_plans, tmp_path, monkeypatch, caplog)
    warnings = [w for w in logged if "crashed the probe" in w]
    assert len(warnings) == 1 and "\n" not in warnings[0]


def test_the_table_is_valid_and_every_row_has_a_source() -> None:
    table = edgetpu_runtime.load_table()
    rows = [*table.builds, *table.compat]
    assert rows and all("https://" in row.source for row in rows)
    assert {row.build for row in table.compat} <= {row.id for row in table.builds}
    assert {row.backend for row in table.compat} <= set(edgetpu_runtime.BACKENDS)


@pytest.mark.parametrize("version, kind, tf", [
    ("16.0", "coral-tf2.5", "2.5"),
    ("16.0-2", "coral-tf2.5", "2.5"),
    ("16.0tf2.16.1-1.bookworm", "rebuilt", "2.16.1"),
    ("16.0tf2.13.1-1.bookworm", "rebuilt", "2.13.1"),
    ("15.0", None, None),
])
def test_builds_are_told_apart_by_their_package_version(version, kind, tf) -> None:
    build = identify(("libedgetpu1-std", version))
    assert (build.kind, build.tf_version) == (kind, tf)


def test_the_table_says_who_loads_which_build() -> None:
    coral = identify(("libedgetpu1-std", "16.0"))
    assert loads(coral, "tflite_runtime", "2.5.0.post1") is True
    assert loads(coral, "tflite_runtime", "2.11.1") is True
    assert loads(coral, "tflite_runtime", "2.12.0") is False
    assert loads(coral, "ai-edge-litert", "1.4.0") is False
    rebuilt = identify(("libedgetpu1-max", "16.0tf2.17.0-1.bookworm"))
    assert loads(rebuilt, "ai-edge-litert", "2.3.0") is True
    assert loads(identify(("libedgetpu1-std", "16.0tf2.13.1-1")), "tflite_runtime", "2.14.1") is True
    assert loads(Build(), "ai-edge-litert", "2.3.0") is None


def test_the_backend_for_tpu_stages_follows_the_table() -> None:
    coral = identify(("libedgetpu1-std", "16.0"))
    assert preferred_backend(coral, BOTH) == "tflite_runtime"
    # A tflite_runtime past the break loads Coral's build no better: nothing to prefer.
    assert preferred_backend(coral, {**BOTH, "tflite_runtime": "2.13.0"}) is None
    assert preferred_backend(identify(("libedgetpu1-std", "16.0tf2.16.1-1")), BOTH) == "ai-edge-litert"
    assert preferred_backend(Build(), BOTH) == "ai-edge-litert"


def test_tpu_backend_prefers_tflite_runtime_for_corals_build(monkeypatch) -> None:
    monkeypatch.delenv(interpreter.ENV_BACKEND, raising=False)
    monkeypatch.setattr(interpreter, "available_backends", lambda: dict(BOTH))
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: ("libedgetpu1-std", "16.0"))
    assert interpreter.tpu_backend() == "tflite_runtime"
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: ("libedgetpu1-std", "16.0tf2.17.0-1"))
    assert interpreter.tpu_backend() == "ai-edge-litert"
    monkeypatch.setenv(interpreter.ENV_BACKEND, "ai-edge-litert")
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: ("libedgetpu1-std", "16.0"))
    assert interpreter.tpu_backend() == interpreter.BACKEND


def test_an_unknown_forced_backend_is_refused(monkeypatch) -> None:
    monkeypatch.setenv(interpreter.ENV_BACKEND, "tensorflow")
    with pytest.raises(ValueError, match="EDGECAP_BACKEND='tensorflow': not a TFLite backend"):
        interpreter.forced_backend()
    monkeypatch.setenv(interpreter.ENV_BACKEND, "tflite-runtime")
    assert interpreter.forced_backend() == "tflite_runtime"


@pytest.mark.parametrize("platform, name", [
    ("linux", "libedgetpu.so.1"), ("darwin", "libedgetpu.1.dylib"), ("win32", "edgetpu.dll"),
])
def test_each_platform_has_its_library_name(platform, name, monkeypatch) -> None:
    assert edgetpu_runtime.default_library(platform) == name
    monkeypatch.delenv(edgetpu_runtime.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(edgetpu_runtime.sys, "platform", platform)
    assert edgetpu_runtime.library_name() == name


def test_native_messages_become_one_line() -> None:
    assert edgetpu_runtime.one_line("Failed to load delegate from libedgetpu.so.1\n\n") == \
        "Failed to load delegate from libedgetpu.so.1"
    assert edgetpu_runtime.one_line("a\n b \nc") == "a; b; c"


def test_a_crash_with_corals_build_names_the_fix(fakes, monkeypatch) -> None:
    _use(monkeypatch, fakes["segfault"])
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: ("libedgetpu1-std", "16.0"))
    with pytest.raises(EdgecapError, match=r"libedgetpu1-std 16.0 \(Coral's build, TF 2.5\)\): a libedgetpu/"
                       r"TFLite mismatch; Coral's libedgetpu 16.0 needs tflite_runtime below 2.12"):
        stages.load_edgetpu_delegate(parse_device("pci:0"), backend="ai-edge-litert")


def test_a_backend_that_is_not_installed_is_an_error_not_a_crash(fakes) -> None:
    missing = [b for b in edgetpu_runtime.BACKENDS if b not in interpreter.available_backends()]
    if not missing:
        pytest.skip("both backends are installed")
    result = edgetpu_runtime.probe(str(fakes["stub"]), "usb:0", missing[0])
    assert (result.kind, result.message.split(" (")[0]) == ("error", f"{missing[0]} is not installed")
