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
    for name in ("segfault", "no_device", "stub", "abort", "prepare_segfault"):
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
        assert "usb_clock_mhz" in report and report["usb_clock"]  # std (250) or max (500), or why unknown


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
                       r"TFLite mismatch; Coral's libedgetpu 16.0 runs under tflite-runtime below 2.12 only: ") as err:
        stages.load_edgetpu_delegate(parse_device("pci:0"), backend="ai-edge-litert")
    message = str(err.value)
    from edgecap.configurations import this_python

    if this_python() == "3.9":
        assert "pip install 'tflite-runtime==2.11.0' 'numpy<2'" in message
    else:  # the fix that has no wheel here is not offered as a pip install
        assert "pip install 'tflite-runtime" not in message
        assert "a Python 3.9 venv with 'tflite-runtime==2.11.0'" in message
        assert f"has no wheel for Python {this_python()}" in message


@pytest.mark.parametrize("python,machine,build,tf,expect", [
    ("3.9", "aarch64", "coral-tf2.5", None, ["pip install 'tflite-runtime==2.11.0' 'numpy<2' "
                                             "'opencv-python-headless<4.12' and set EDGECAP_BACKEND=tflite_runtime"]),
    ("3.11", "aarch64", "coral-tf2.5", None, ["a Python 3.9 venv with"]),
    ("3.12", "x86_64", "coral-tf2.5", None, ["a Python 3.9 venv with"]),
    ("3.11", "aarch64", "rebuilt", "2.17.0", ["pip install 'ai-edge-litert' 'numpy'"]),
    ("3.12", "x86_64", "rebuilt", "2.13.1", ["a Python 3.9 or 3.10 or 3.11 venv with 'tflite-runtime>=2.13,<2.15'"]),
    ("3.10", "x86_64", "rebuilt", "2.14.0", ["pip install 'tflite-runtime>=2.13,<2.15'"]),
])
def test_the_advice_names_only_routes_this_python_has(python, machine, build, tf, expect) -> None:
    from edgecap.configurations import routes

    found = routes(build, tf, python, machine)
    assert len(found) == len(expect)
    for said, start in zip(found, expect):
        assert said.startswith(start), said


def test_the_matrix_is_valid_and_every_row_has_a_source() -> None:
    from edgecap import configurations

    matrix = configurations.load()
    builds = {b.id for b in edgetpu_runtime.load_table().builds}
    assert {s.build for s in matrix.stacks} <= builds
    assert all(row.source for row in [*matrix.wheels, *matrix.stacks, *matrix.targets, *matrix.refused])
    assert {c for t in matrix.targets for c in t.checked} <= {c.id for c in matrix.checks}
    for stack in matrix.stacks:  # every stack's interpreter says where its wheels are
        assert any(w.requirement == stack.interpreter for w in matrix.wheels), stack.id


def test_a_backend_that_is_not_installed_is_an_error_not_a_crash(fakes) -> None:
    missing = [b for b in edgetpu_runtime.BACKENDS if b not in interpreter.available_backends()]
    if not missing:
        pytest.skip("both backends are installed")
    result = edgetpu_runtime.probe(str(fakes["stub"]), "usb:0", missing[0])
    assert (result.kind, result.message.split(" (")[0]) == ("error", f"{missing[0]} is not installed")


# -- USB TPUs in libedgetpu's order, opened one at a time ---------------------------------------


@pytest.fixture
def reordering(tmp_path, monkeypatch):
    """tests/fake_libedgetpu/reorder.c over two USB TPUs: 1-1 running its firmware, 1-2 in DFU.

    Returns (library, usb dir, log): the fake lists 1-2 first (DFU first, as libedgetpu)
    and moves it behind 1-1 when it is opened (its firmware loads).
    """
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake libedgetpu")
    library = tmp_path / "lib" / "libedgetpu.so.1"
    library.parent.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(FAKES / "reorder.c")],
                   check=True, capture_output=True)
    usb = tmp_path / "sys" / "bus" / "usb" / "devices"
    for name, ids in (("1-1", ("18d1", "9302")), ("1-2", ("1a6e", "089a"))):
        (usb / name).mkdir(parents=True)
        (usb / name / "idVendor").write_text(ids[0] + "\n")
        (usb / name / "idProduct").write_text(ids[1] + "\n")
    log = tmp_path / "opens.log"
    monkeypatch.setenv("FAKE_EDGETPU_USB", str(usb))
    monkeypatch.setenv("FAKE_EDGETPU_LOG", str(log))
    _use(monkeypatch, library)
    return library, usb, log


def _opened(log: Path) -> list:
    return [Path(line.split()[1]).name for line in log.read_text().splitlines() if line.startswith("begin")]


def test_the_fake_reorders_as_libedgetpu_does(reordering) -> None:
    library, usb, log = reordering
    # What edgecap did before: each stage opened :N as it came, with a TPU still in DFU.
    assert edgetpu_runtime.enumerate_tpus(str(library)) == [("usb", str(usb / "1-2")), ("usb", str(usb / "1-1"))]
    for n in (0, 1):
        assert edgetpu_runtime.probe(str(library), f":{n}", interpreter.BACKEND).ok
    assert _opened(log) == ["1-2", "1-2"]  # :0 loaded 1-2's firmware, which moved it to :1: one TPU twice


def test_usb_tpus_are_woken_then_listed_and_opened_in_libedgetpus_order(reordering, monkeypatch) -> None:
    from edgecap.devices import list_devices

    library, usb, log = reordering
    # As libedgetpu indexes them now (no firmware loaded yet): DFU first.
    assert [(i.device, Path(i.path).name, i.state) for i in list_devices()[1:]] == [
        ("tpu:0", "1-2", "dfu"), ("tpu:1", "1-1", "loaded")]
    # Woken (as detect_hardware and the first TPU opening do): both loaded, the order as it stays.
    woken = list_devices(wake=True)[1:]
    assert [(i.device, Path(i.path).name, i.state) for i in woken] == [
        ("tpu:0", "1-1", "loaded"), ("tpu:1", "1-2", "loaded")]
    log.write_text("")
    for n in (0, 1):
        stages.load_edgetpu_delegate(parse_device(f"tpu:{n}"))
    # Each stage's probe and its delegate open the device edgecap listed: two TPUs, two devices.
    assert _opened(log) == ["1-1", "1-1", "1-2", "1-2"]


def test_tpu_stages_open_one_at_a_time(reordering) -> None:
    import threading

    library, usb, log = reordering
    errors = []

    def open_one(n: int) -> None:
        try:
            stages.load_edgetpu_delegate(parse_device(f"usb:{n}"))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    events = [line.split()[0] for line in log.read_text().splitlines()]
    # The wake opened 1-2 first; then every begin is followed by its own end: no two opens overlap.
    assert events == ["begin", "end"] * (len(events) // 2) and len(events) >= 8
    assert sorted(set(_opened(log)[1:])) == ["1-1", "1-2"]


# -- the clock ---------------------------------------------------------------------------------


@pytest.mark.parametrize("package,mhz", [
    (("libedgetpu1-std", "16.0"), 250), (("libedgetpu1-max", "16.0"), 500),
    (("libedgetpu1-std", "16.0tf2.17.0-1.bookworm"), 250),
])
def test_the_usb_clock_follows_the_installed_package(package, mhz) -> None:
    clock = edgetpu_runtime.usb_clock(package)
    assert clock.mhz == mhz and package[0] in clock.describe()
    assert edgetpu_runtime.usb_speed(clock) == mhz / 500


def test_without_a_package_the_librarys_own_bytes_tell_the_build(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: None)
    throttled, direct = tmp_path / "std.so", tmp_path / "max.so"
    throttled.write_bytes(b"\x7fELF...EdgeTpu is throttled.\x00...")  # the THROTTLE branch's log line
    direct.write_bytes(b"\x7fELF...EdgeTpu...\x00")
    assert edgetpu_runtime.usb_clock(None, throttled).mhz == 250
    assert edgetpu_runtime.usb_clock(None, direct).mhz == 500
    assert edgetpu_runtime.usb_clock(None, tmp_path / "absent.so").mhz is None


def test_usb_stages_start_priced_at_the_installed_clock(monkeypatch) -> None:
    from types import SimpleNamespace

    from edgecap import supervisor
    from edgecap.devices import parse_device

    def stage(device, link):
        one = SimpleNamespace(device=device, spec=parse_device(device), cost=SimpleNamespace(link=link))
        one.copies = (one,)
        return one

    start = SimpleNamespace(plan=SimpleNamespace(active_stages=[
        stage("pci:0", "pcie"), stage("usb:0", "usb3"), stage("cpu", None)]))
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: ("libedgetpu1-std", "16.0"))
    prior = supervisor._clock_prior(start)
    assert list(prior) == ["usb:0"] and prior["usb:0"].speed == 0.5  # PCIe is not throttled
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: ("libedgetpu1-max", "16.0"))
    assert supervisor._clock_prior(start) == {}


def test_a_replicated_stages_usb_copies_start_priced_at_the_installed_clock(monkeypatch, shipped_bundle) -> None:
    # The demo on rpi4-2usb runs its CNN as copies on usb:0 (the stage's own device) and usb:1 (a replica).
    from types import SimpleNamespace

    from edgecap import supervisor
    from edgecap.bundle import load_bundle
    from edgecap.plans.compiler import plan_for_board
    from edgecap.plans.pricing import price

    plan = plan_for_board(load_bundle(shipped_bundle), "rpi4-2usb")
    (stage,) = [s for s in plan.active_stages if s.replicas]
    usb = [c.device for c in stage.copies if c.spec.kind == "tpu"]
    assert usb == ["usb:0", "usb:1"]
    monkeypatch.setattr(edgetpu_runtime, "installed_package", lambda: ("libedgetpu1-std", "16.0"))
    prior = supervisor._clock_prior(SimpleNamespace(plan=plan))
    assert sorted(prior) == usb and {c.speed for c in prior.values()} == {0.5}
    # The pricing applies the correction to the copy as to a stage: each USB copy's invoke is slower.
    slow, fast = price(plan, prior), price(plan)
    for copy in usb:
        assert slow.device_ms(copy) > fast.device_ms(copy)
    assert slow.period_ms > fast.period_ms


# -- truthful advice ---------------------------------------------------------------------------


def test_a_usb_abort_is_retried_once_and_then_advises_cable_port_and_power(fakes, monkeypatch, tmp_path) -> None:
    _use(monkeypatch, fakes["abort"])
    count = tmp_path / "count"
    monkeypatch.setenv("FAKE_EDGETPU_COUNT", str(count))
    monkeypatch.setenv("FAKE_EDGETPU_ABORTS", "1")  # fails once: the retry opens it
    assert edgetpu_runtime.probe(str(fakes["abort"]), "usb:0", interpreter.BACKEND).ok
    assert count.read_text().strip() == "2"
    edgetpu_runtime._CACHE.clear()
    count.unlink()
    monkeypatch.setenv("FAKE_EDGETPU_ABORTS", "9")
    with pytest.raises(EdgecapError) as err:
        stages.load_edgetpu_delegate(parse_device("usb:0"))
    message = str(err.value)
    assert "aborted in the probe, twice" in message and "F driver/usb/usb_driver.cc:1063]" in message
    assert "cable" in message and "port" in message and "power" in message
    assert "mismatch" not in message and "\n" not in message
    assert count.read_text().strip() == "2"  # retried once, not more


def test_a_crash_of_the_shipped_probe_model_blames_the_interpreter_build(fakes, monkeypatch) -> None:
    _use(monkeypatch, fakes["prepare_segfault"])
    with pytest.raises(EdgecapError) as err:
        stages.load_edgetpu_delegate(parse_device("usb:0"))
    message = str(err.value)
    assert "the delegate loaded, then" in message and "crashes on this CPU" in message
    assert "re-export" not in message and "mismatch" not in message and "\n" not in message
