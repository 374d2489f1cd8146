"""libedgetpu: which build is installed, which TFLite backend loads it, and a crash-safe probe.

Coral's released libedgetpu (16.0) is built against TensorFlow 2.5 and
segfaults inside TFLite builds newer than 2.11; rebuilt libraries load under
the newer ones (``data/edgetpu_compat.json`` lists which, with sources). A
segfault in ``load_delegate`` cannot be caught, so before the first real
delegate load of a process ``check`` runs a probe in a child process
(``_CHILD``): it loads the library and the delegate and invokes a model
through it. A child killed by a signal or finding no device becomes one
``EdgecapError`` line in the parent, which the captioner's auto fallback turns
into a CPU run. The same child lists the EdgeTPUs with libedgetpu's own
``edgetpu_list_devices`` (``enumerate_tpus``), first bringing every USB TPU
out of its bootloader, so that libedgetpu never loads in this process and the
indices edgecap shows are libedgetpu's.

Environment:
  EDGECAP_EDGETPU_LIBRARY: The libedgetpu to load (a name or a path), instead
    of the platform's (``libedgetpu.so.1``, ``libedgetpu.1.dylib``, ``edgetpu.dll``).
  EDGECAP_BACKEND: ``ai-edge-litert`` or ``tflite_runtime``: the interpreter
    package to use, whatever the table says (see ``edgecap.interpreter``).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import msgspec

from edgecap import configurations, schema
from edgecap.errors import ConfigError, EdgecapError

ENV_LIBRARY = "EDGECAP_EDGETPU_LIBRARY"
LIBRARY_NAMES = {"linux": "libedgetpu.so.1", "darwin": "libedgetpu.1.dylib", "win32": "edgetpu.dll"}
PACKAGES = ("libedgetpu1-std", "libedgetpu1-max")
BACKENDS = ("ai-edge-litert", "tflite_runtime")
TABLE = Path(__file__).parent / "data" / "edgetpu_compat.json"
PROBE_MODEL = Path(__file__).parent / "data" / "probe.tflite"
# What the child prints before each line of its report, so that native chatter
# on stdout cannot be mistaken for it.
_TAG = "edgecap-probe: "
# The probe child's code; its arguments, all positional: LIBRARY DEVICE BACKEND MODEL WHAT, WHAT
# one of probe, version, list, wake (list after bringing USB TPUs out of DFU), with '' for the
# default device and the shipped probe model.
_CHILD = "import sys; from edgecap.edgetpu_runtime import _child_main; sys.exit(_child_main(sys.argv[1:]))"
_PROBE_TIMEOUT_S = 120.0
# A USB TPU in its bootloader (Global Unichip 1a6e:089a) and after its firmware (Google 18d1:9302).
_DFU_PRODUCT, _LOADED_PRODUCT = "089a", "9302"
# After a firmware load the device leaves the bus and comes back as 18d1:9302 (libedgetpu
# waits for that in its open); a few seconds bound the wait for the list to show it.
_WAKE_WAIT_S = 6.0
# The string only libedgetpu1-std's build holds: tflite/edgetpu_manager_direct.cc logs it in the
# THROTTLE_EDGE_TPU branch that drops a USB TPU's "Max" to "High" (debian/rules: -std is the
# throttled build, -max the direct one).
_THROTTLED_MARK = b"EdgeTpu is throttled."


def default_library(platform: Optional[str] = None) -> str:
    """Returns libedgetpu's file name on ``platform`` (a ``sys.platform`` value; default: this one)."""
    for prefix, name in LIBRARY_NAMES.items():
        if (platform or sys.platform).startswith(prefix):
            return name
    return LIBRARY_NAMES["linux"]


def library_name() -> str:
    """Returns the libedgetpu to load: ``$EDGECAP_EDGETPU_LIBRARY``, else the platform's."""
    return os.environ.get(ENV_LIBRARY) or default_library()


def one_line(text: str) -> str:
    """Joins a native message's lines into one (libedgetpu's errors end in newlines)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


# -- the compatibility table ------------------------------------------------------------------


class BuildRow(msgspec.Struct, forbid_unknown_fields=True):
    """A kind of libedgetpu build, recognised by its Debian package version."""

    id: str
    describes: str
    package_version: str  # a regular expression; group "tf" is the TF it was built against
    tf_version: Optional[str]
    source: str
    inferred: bool


class CompatRow(msgspec.Struct, forbid_unknown_fields=True):
    """Whether one build of libedgetpu loads under a range of one backend's versions."""

    build: str
    backend: str
    min: Optional[str]
    below: Optional[str]
    loads: bool
    source: str
    inferred: bool
    note: str = ""
    tf_min: Optional[str] = None
    tf_below: Optional[str] = None


class Table(msgspec.Struct, forbid_unknown_fields=True):
    """``data/edgetpu_compat.json``."""

    about: str
    builds: List[BuildRow]
    compat: List[CompatRow]


@lru_cache(maxsize=None)
def load_table(path: Path = TABLE) -> Table:
    """Reads the compatibility table.

    Raises:
      ConfigError: If the file is missing or malformed.
    """
    return schema.read_file(path, Table, what="libedgetpu compatibility table",
                            fix="reinstall edgecap", error=ConfigError)


def _version(text: Optional[str]) -> Tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text or "")[:3])


def _within(version: Optional[str], low: Optional[str], below: Optional[str]) -> bool:
    v = _version(version)
    return (low is None or v >= _version(low)) and (below is None or v < _version(below))


@dataclass(frozen=True)
class Build:
    """The installed libedgetpu as far as its package tells.

    Attributes:
      package: The Debian package (``libedgetpu1-std``/``-max``), or None.
      package_version: Its version, or None.
      kind: The table's build id (``coral-tf2.5``, ``rebuilt``), or None if unknown.
      tf_version: The TensorFlow it was built against, where known.
    """

    package: Optional[str] = None
    package_version: Optional[str] = None
    kind: Optional[str] = None
    tf_version: Optional[str] = None

    def describe(self) -> str:
        """Returns e.g. ``libedgetpu1-std 16.0 (Coral's build, TF 2.5)``."""
        if self.package is None:
            return "libedgetpu of unknown build (no Debian package)"
        what = {"coral-tf2.5": "Coral's build", "rebuilt": "a rebuild"}.get(self.kind or "", "unknown build")
        tf = f", TF {self.tf_version}" if self.tf_version else ""
        return f"{self.package} {self.package_version} ({what}{tf})"


def installed_package() -> Optional[Tuple[str, str]]:
    """Returns ``(package, version)`` of the installed libedgetpu Debian package, or None."""
    if shutil.which("dpkg-query") is None:
        return None
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Status}\n", *PACKAGES],
            capture_output=True, text=True, timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "installed":
            return parts[0], parts[1]
    return None


def identify(package: Optional[Tuple[str, str]] = None, table: Optional[Table] = None) -> Build:
    """Classifies a libedgetpu package by the table's builds.

    Args:
      package: ``(name, version)``; default: what dpkg says is installed.
      table: Default: the shipped table.
    """
    package = installed_package() if package is None else package
    if package is None:
        return Build()
    table = table or load_table()
    name, version = package
    for row in table.builds:
        match = re.match(row.package_version, version)
        if match:
            tf = match.groupdict().get("tf") or row.tf_version
            return Build(name, version, row.id, tf)
    return Build(name, version)


def loads(build: Build, backend: str, version: Optional[str],
          table: Optional[Table] = None) -> Optional[bool]:
    """Says whether the table expects ``build`` to load under ``backend`` ``version``; None if it does not know."""
    if build.kind is None:
        return None
    for row in (table or load_table()).compat:
        if (row.build == build.kind and row.backend == backend
                and _within(build.tf_version, row.tf_min, row.tf_below)
                and _within(version, row.min, row.below)):
            return row.loads
    return None


def preferred_backend(build: Build, available: Dict[str, Optional[str]],
                      table: Optional[Table] = None) -> Optional[str]:
    """Chooses the backend to run TPU stages under, by the table.

    The rule: among the importable backends, the first (in ``BACKENDS`` order,
    ai-edge-litert first) the table says loads ``build``; else the first the
    table does not rule out; else None (no importable backend loads it).

    Args:
      build: The installed libedgetpu (``identify``).
      available: Importable backend name -> its version.
      table: Default: the shipped table.
    """
    verdicts = {b: loads(build, b, available[b], table) for b in BACKENDS if b in available}
    for wanted in (True, None):
        for backend, verdict in verdicts.items():
            if verdict is wanted:
                return backend
    return None


# -- the probe ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """What a probe child found.

    Attributes:
      kind: ``ok``, ``crash`` (killed by a signal), ``abort`` (libedgetpu's LOG(FATAL):
        SIGABRT, or an ``F driver/usb/...`` line), ``no-library``, ``no-device`` or ``error``.
      message: One line on what went wrong ('' when ok).
      version: libedgetpu's ``edgetpu_version()``, if the child got that far.
      path: The file the library was loaded from, where the child could tell.
      step: How far the child got: ``loaded`` (the library), ``delegate`` (the
        delegate created), ``invoked``; '' before the library loaded.
      devices: For a list: ``(kind, path)`` of each EdgeTPU, in libedgetpu's order.
    """

    kind: str
    message: str = ""
    version: Optional[str] = None
    path: Optional[str] = None
    step: str = ""
    devices: Tuple[Tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def resolve_library(library: str) -> Optional[Path]:
    """Finds the file a library name loads from (a path as given, else the linker's cache), or None."""
    if os.sep in library or "/" in library:
        return Path(library) if Path(library).exists() else None
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for directory in dirs:
        if (Path(directory) / library).exists():
            return Path(directory) / library
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else None)
    if ldconfig:
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        for line in out.splitlines():
            name, _, target = line.strip().partition(" => ")
            if name.split(" ")[0] == library and target:
                return Path(target)
    return None


_CACHE: Dict[Tuple[str, Optional[str], Optional[int], str, str], ProbeResult] = {}
_CACHE_LOCK = threading.Lock()


def probe(library: str, device: str, backend: str, model: "str | os.PathLike[str] | None" = None,
          timeout: float = _PROBE_TIMEOUT_S) -> ProbeResult:
    """Loads ``library``'s delegate for ``device`` and invokes a model through it, in a child process.

    Cached for the process per (library file and its mtime, device, backend):
    the first model probed on a device stands for the rest. An abort (a USB
    transfer failure) is retried once.

    Args:
      library: libedgetpu's name or path.
      device: The delegate's ``device`` option (``usb:0``, ``:1``, ``pci:0``).
      backend: ``ai-edge-litert`` or ``tflite_runtime``.
      model: The model to invoke (default: a tiny CPU model shipped with edgecap).
      timeout: Seconds before a hung child counts as an error.
    """
    path = resolve_library(library)
    try:
        mtime = path.stat().st_mtime_ns if path else None
    except OSError:
        mtime = None
    key = (library, str(path) if path else None, mtime, device, backend)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    result = _run_probe(library, device, backend, model, timeout)
    if result.kind == "abort":  # a USB transfer that failed once may not fail again
        result = _run_probe(library, device, backend, model, timeout)
    with _CACHE_LOCK:
        _CACHE[key] = result
    return result


def runtime_version(library: Optional[str] = None, timeout: float = 30.0) -> ProbeResult:
    """Loads libedgetpu in a child and reads its ``edgetpu_version()`` (no delegate, no device).

    Returns:
      A result whose ``version`` is e.g. ``BuildLabel(COMPILER=...), RuntimeVersion(14)``;
      kind ``no-library`` where it is not installed, ``crash`` where loading it crashed.
    """
    return _run_probe(library or library_name(), "", BACKENDS[0], None, timeout, version_only=True)


def installed() -> Dict[str, Optional[str]]:
    """Says what is installed, for people (``edgecap edgetpu-runtime``).

    Returns:
      The library's name, the path it loads from, whether it loads (a probe
      kind, read in a child: loading a mismatched library may itself crash),
      libedgetpu's ``edgetpu_version()``, the Debian package, its version,
      the build the table recognises, the TensorFlow it was built against, and
      the clock it runs USB TPUs at (``usb_clock``).
    """
    build, loaded, clock = identify(), runtime_version(), usb_clock()
    return {"library": library_name(), "path": loaded.path, "loads": loaded.kind,
            "edgetpu_version": loaded.version, "package": build.package,
            "package_version": build.package_version, "build": build.kind,
            "tf_version": build.tf_version, "usb_clock_mhz": clock.mhz, "usb_clock": clock.describe()}


def _run_probe(library: str, device: str, backend: str,
               model: "str | os.PathLike[str] | None", timeout: float,
               version_only: bool = False, what: Optional[str] = None) -> ProbeResult:
    what = what or ("version" if version_only else "probe")
    cmd = [sys.executable, "-c", _CHILD, library, device, backend,
           "" if model is None else os.fspath(model), what]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProbeResult("error", f"the probe did not finish within {timeout:.0f} s")
    report: Dict[str, Any] = {}
    for line in done.stdout.splitlines():
        if line.startswith(_TAG):
            report.update(json.loads(line[len(_TAG):]))
    version, path, step = report.get("version"), report.get("path"), str(report.get("step") or "")
    if report.get("kind"):
        found = tuple((str(k), str(p)) for k, p in report.get("devices") or ())
        return ProbeResult(str(report["kind"]), str(report.get("message") or ""), version, path, step, found)
    return _died(done, version, path, step)


def _died(done: "subprocess.CompletedProcess[str]", version: Optional[str], path: Optional[str],
          step: str) -> ProbeResult:
    """What a child that reported no result died of: an abort (libedgetpu's LOG(FATAL)) or a crash."""
    fatal = _fatal_line(done.stderr)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        kind = "abort" if fatal or -done.returncode == signal.SIGABRT else "crash"
        return ProbeResult(kind, f"the probe was killed by {name}" + (f" ({fatal})" if fatal else ""),
                           version, path, step)
    last = one_line(done.stderr).rsplit("; ", 1)[-1] if done.stderr.strip() else ""
    # Windows reports an access violation as exit status 0xC0000005, not a signal.
    return ProbeResult("abort" if fatal else "crash", f"the probe exited with status {done.returncode}"
                       + (f" ({fatal or last})" if fatal or last else ""), version, path, step)


def _fatal_line(stderr: str) -> str:
    """libedgetpu's LOG(FATAL) line (glog: ``F`` then the date, file and line), or ''."""
    for line in stderr.splitlines():
        if re.match(r"^F[\d :.]*\s*\S*\.cc:\d+\]", line.strip()) or re.match(r"^F \S*driver/", line.strip()):
            return line.strip()
    return ""


def check(spec: str, library: str, device: str, backend: str,
          model: "str | os.PathLike[str] | None" = None) -> ProbeResult:
    """Probes libedgetpu for one device and raises one line if it would not run.

    Args:
      spec: The device as the user named it, for the message (``usb:0``).
      library, device, backend, model: As for ``probe``.

    Returns:
      The passing probe's result.

    Raises:
      EdgecapError: One line naming what failed and the fix.
    """
    result = probe(library, device, backend, model)
    if result.ok:
        return result
    where = f"{spec}: {library}"
    if result.kind == "no-library":
        raise EdgecapError(f"{spec}: {library} not found; install the Edge TPU runtime (or set "
                           f"{ENV_LIBRARY}), check `edgecap devices`, or run on cpu / emu-tpu:N")
    if result.kind == "no-device":
        raise EdgecapError(f"{where}: no Edge TPU at {device} ({result.message}); plug it in or "
                           "check `edgecap devices` and its permissions, or run on cpu / emu-tpu:N")
    if result.kind == "abort":
        raise EdgecapError(
            f"{where} aborted in the probe, twice ({result.message}): libedgetpu stops the process when a "
            "USB transfer fails; check the cable (a short USB 3 cable), the port (a USB 3 port on the board, "
            "not a hub) and the power (the Accelerator draws up to 900 mA: a powered hub or a stronger supply), "
            "then try again, or run on cpu / emu-tpu:N")
    if result.kind == "crash":
        build = identify()
        version = _backend_version(backend)
        under = f"{backend} {version or ''}".rstrip()
        if result.step in ("delegate", "interpreter") and model is None:
            import platform

            raise EdgecapError(
                f"{where}: the delegate loaded, then {under} crashed running edgecap's own probe model "
                f"({result.message}): this interpreter build crashes on this CPU ({platform.machine()}), "
                f"not the model; use another interpreter: {_routes(build)}")
        raise EdgecapError(
            f"{where} crashed the probe under {under}"
            + f" ({result.message}; {build.describe()}): a libedgetpu/TFLite mismatch; "
            + _fix(build, backend)
        )
    raise EdgecapError(f"{where}: cannot open the EdgeTPU ({result.message}); check "
                       "`edgecap devices`, or run on cpu / emu-tpu:N")


def _routes(build: Build) -> str:
    """The stacks that run ``build``, as this Python can get them (``edgecap.configurations``)."""
    found = configurations.routes(build.kind, build.tf_version)
    return "; or ".join(found) if found else "none for this Python (docs/deploy.md, the matrix)"


def _fix(build: Build, backend: str) -> str:
    if build.kind == "coral-tf2.5":
        return ("Coral's libedgetpu 16.0 runs under tflite-runtime below 2.12 only: " + _routes(build)
                + "; or install a libedgetpu rebuilt for newer TFLite (github.com/feranick/libedgetpu)")
    other = "tflite_runtime" if backend == "ai-edge-litert" else "ai-edge-litert"
    return (f"install a libedgetpu built for {backend} (github.com/feranick/libedgetpu) or try "
            f"EDGECAP_BACKEND={other}; or run on cpu / emu-tpu:N")


def _backend_version(backend: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version("ai-edge-litert" if backend == "ai-edge-litert" else "tflite-runtime")
    except metadata.PackageNotFoundError:
        return None


# -- the child ------------------------------------------------------------------------------


def _report(**fields: Optional[str]) -> None:
    print(_TAG + json.dumps(fields), flush=True)


def _loaded_path(library: str) -> Optional[str]:
    try:
        with open("/proc/self/maps") as maps:
            name = Path(library).name
            for line in maps:
                if line.rstrip().endswith(name):
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return library if Path(library).exists() else None


def _child_probe(library: str, device: str, backend: str, model: Optional[str],
                 version_only: bool = False) -> int:
    import numpy as np

    try:
        lib = ctypes.CDLL(library)
    except OSError as exc:
        _report(kind="no-library", message=one_line(exc))
        return 1
    version = None
    if hasattr(lib, "edgetpu_version"):
        lib.edgetpu_version.restype = ctypes.c_char_p
        version = (lib.edgetpu_version() or b"").decode(errors="replace")
    # Reported before the delegate loads, so that a crash still leaves the version.
    _report(version=version, path=_loaded_path(library), step="loaded")
    if version_only:
        _report(kind="ok")
        return 0
    try:
        if backend == "ai-edge-litert":
            from ai_edge_litert import interpreter as tfl
        else:
            from tflite_runtime import interpreter as tfl  # type: ignore[no-redef]
    except ImportError as exc:
        _report(kind="error", message=f"{backend} is not installed ({one_line(exc)})")
        return 1
    try:
        delegate = tfl.load_delegate(library, {"device": device} if device else {})
    except (ValueError, RuntimeError, OSError) as exc:
        _report(kind="no-device", message=one_line(exc))
        return 1
    _report(step="delegate")
    try:
        interp = tfl.Interpreter(model_path=model or os.fspath(PROBE_MODEL),
                                 experimental_delegates=[delegate])
        interp.allocate_tensors()
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], np.zeros(d["shape"], dtype=d["dtype"]))
        _report(step="interpreter")
        interp.invoke()
    except (ValueError, RuntimeError) as exc:
        _report(kind="error", message=one_line(exc))
        return 1
    _report(kind="ok", step="invoked")
    return 0


class _Device(ctypes.Structure):
    # struct edgetpu_device in libedgetpu's tflite/public/edgetpu_c.h.
    _fields_ = [("type", ctypes.c_int), ("path", ctypes.c_char_p)]


def _c_api(lib: ctypes.CDLL) -> None:
    lib.edgetpu_list_devices.restype = ctypes.POINTER(_Device)
    lib.edgetpu_list_devices.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    lib.edgetpu_free_devices.argtypes = [ctypes.POINTER(_Device)]
    lib.edgetpu_create_delegate.restype = ctypes.c_void_p
    lib.edgetpu_create_delegate.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.edgetpu_free_delegate.argtypes = [ctypes.c_void_p]


def _c_list(lib: ctypes.CDLL) -> List[Tuple[str, str]]:
    """libedgetpu's own enumeration (EDGETPU_APEX_PCI = 0, EDGETPU_APEX_USB = 1), in its order."""
    n = ctypes.c_size_t(0)
    found = lib.edgetpu_list_devices(ctypes.byref(n))
    try:
        return [("pci" if found[i].type == 0 else "usb", (found[i].path or b"").decode(errors="replace"))
                for i in range(n.value)]
    finally:
        if found:
            lib.edgetpu_free_devices(found)


def usb_state(path: str) -> Optional[str]:
    """``dfu`` or ``loaded`` for a USB TPU's sysfs path (libedgetpu's paths are sysfs ones), else None."""
    try:
        product = (Path(path) / "idProduct").read_text().strip()
    except OSError:
        return None
    return {_DFU_PRODUCT: "dfu", _LOADED_PRODUCT: "loaded"}.get(product)


def _child_list(library: str, wake: bool) -> int:
    try:
        lib = ctypes.CDLL(library)
        _c_api(lib)
    except (OSError, AttributeError) as exc:
        _report(kind="no-library", message=one_line(exc))
        return 1
    _report(step="loaded")
    found = _c_list(lib)
    if wake:
        import time

        # Opening a TPU in its bootloader loads its firmware; it comes back as another
        # USB device, later in libedgetpu's order (DFU devices are listed first).
        for kind, path in found:
            if kind == "usb" and usb_state(path) == "dfu":
                delegate = lib.edgetpu_create_delegate(1, path.encode(), None, 0)
                if delegate:
                    lib.edgetpu_free_delegate(delegate)
        end = time.monotonic() + _WAKE_WAIT_S
        found = _c_list(lib)
        while any(k == "usb" and usb_state(p) == "dfu" for k, p in found) and time.monotonic() < end:
            time.sleep(0.2)  # the device re-enumerates on its own; nothing to block on
            found = _c_list(lib)
    _report(kind="ok", devices=found)
    return 0


def _child_main(argv: Sequence[str]) -> int:
    """Runs the probe child (``_CHILD``) on its positional arguments; returns its exit status."""
    library, device, backend, model, what = argv
    if what in ("list", "wake"):
        return _child_list(library or library_name(), what == "wake")
    return _child_probe(library or library_name(), device, backend, model or None, what == "version")


# -- enumeration and the clock ------------------------------------------------------------


def enumerate_tpus(library: Optional[str] = None, wake: bool = False,
                   timeout: float = _PROBE_TIMEOUT_S) -> Optional[List[Tuple[str, str]]]:
    """Lists the EdgeTPUs as libedgetpu does, in a child process; None where libedgetpu is not there.

    Args:
      library: libedgetpu's name or path (default: ``library_name()``).
      wake: Bring every USB TPU out of its bootloader first (load its
        firmware), so that the order stays as listed while stages open.
      timeout: Seconds before the child counts as hung.

    Returns:
      ``(kind, path)`` per TPU (``pci``/``usb``), in libedgetpu's order: PCIe,
      then USB TPUs in their bootloader, then those running their firmware;
      None if the library does not resolve or the child fails (the caller reads sysfs).
    """
    library = library or library_name()
    if resolve_library(library) is None:
        return None
    result = _run_probe(library, "", BACKENDS[0], None, timeout, what="wake" if wake else "list")
    return list(result.devices) if result.ok else None


@dataclass(frozen=True)
class Clock:
    """The clock libedgetpu runs a USB TPU at (PCIe TPUs run the driver's clock, unthrottled).

    Attributes:
      mhz: 500 (``libedgetpu1-max``: "Max") or 250 (``-std``: its THROTTLE build
        drops "Max" to "High"); None when the build cannot be told.
      how: How it was told: the Debian package, or the library's own bytes.
    """

    mhz: Optional[int]
    how: str

    def describe(self) -> str:
        """One line, e.g. ``USB TPUs at 250 MHz (libedgetpu1-std: ...)``."""
        return f"USB TPUs at {self.mhz} MHz ({self.how})" if self.mhz else f"USB TPU clock unknown ({self.how})"


# The clock Coral's published USB Accelerator latencies (and so the board profiles'
# USB TPU figures) were measured at: libedgetpu1-max (compile/boards/*.json sources).
PROFILED_MHZ = 500


def usb_speed(clock: Clock) -> float:
    """A USB TPU's speed at ``clock`` against the profiles' (0.5 at 250 MHz; 1.0 where unknown)."""
    return clock.mhz / PROFILED_MHZ if clock.mhz else 1.0


def usb_clock(package: Optional[Tuple[str, str]] = None, library: Optional[Path] = None) -> Clock:
    """Tells the clock the installed libedgetpu gives a USB TPU.

    The Debian package says it (``libedgetpu1-std``: 250 MHz, ``-max``: 500);
    without one (a library from a tarball, a build of one's own) the library's
    bytes do: only the throttled build holds the line its throttle logs.

    Args:
      package: ``(name, version)``; default: what dpkg says is installed.
      library: The library file; default: where ``library_name()`` resolves.
    """
    package = installed_package() if package is None else package
    if package is not None:
        if package[0].endswith("-max"):
            return Clock(500, f"{package[0]}: the direct build, 'Max'")
        if package[0].endswith("-std"):
            return Clock(250, f"{package[0]}: the THROTTLE build drops 'Max' to 'High'")
    path = library or resolve_library(library_name())
    if path is None:
        return Clock(None, "no libedgetpu")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Clock(None, f"{path}: {exc.strerror or exc}")
    if _THROTTLED_MARK in data:
        return Clock(250, f"{path} is the throttled build")
    return Clock(500, f"{path} is the direct build (no throttle)")
