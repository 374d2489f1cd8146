"""libedgetpu: which build is installed, which TFLite backend loads it, and a crash-safe probe.

Coral's released libedgetpu (16.0) is built against TensorFlow 2.5 and
segfaults inside TFLite builds newer than 2.11; rebuilt libraries load under
the newer ones (``data/edgetpu_compat.json`` lists which, with sources). A
segfault in ``load_delegate`` cannot be caught, so before the first real
delegate load of a process ``check`` runs a probe in a child process
(``_CHILD``): it loads the library and the delegate and invokes a model
through it. A child killed by a signal or finding no device becomes one
``EdgecapError`` line in the parent, which the captioner's auto fallback turns
into a CPU run.

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
from typing import Dict, List, Optional, Sequence, Tuple

import msgspec

from edgecap import schema
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
# The probe child's code; its arguments, all positional: LIBRARY DEVICE BACKEND MODEL probe|version,
# with '' for the default device and the shipped probe model.
_CHILD = "import sys; from edgecap.edgetpu_runtime import _child_main; sys.exit(_child_main(sys.argv[1:]))"
_PROBE_TIMEOUT_S = 120.0


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
      kind: ``ok``, ``crash`` (killed by a signal), ``no-library``, ``no-device`` or ``error``.
      message: One line on what went wrong ('' when ok).
      version: libedgetpu's ``edgetpu_version()``, if the child got that far.
      path: The file the library was loaded from, where the child could tell.
    """

    kind: str
    message: str = ""
    version: Optional[str] = None
    path: Optional[str] = None

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
    the first model probed on a device stands for the rest.

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
      libedgetpu's ``edgetpu_version()``, and the Debian package, its version,
      the build the table recognises and the TensorFlow it was built against.
    """
    build, loaded = identify(), runtime_version()
    return {"library": library_name(), "path": loaded.path, "loads": loaded.kind,
            "edgetpu_version": loaded.version, "package": build.package,
            "package_version": build.package_version, "build": build.kind,
            "tf_version": build.tf_version}


def _run_probe(library: str, device: str, backend: str,
               model: "str | os.PathLike[str] | None", timeout: float,
               version_only: bool = False) -> ProbeResult:
    cmd = [sys.executable, "-c", _CHILD, library, device, backend,
           "" if model is None else os.fspath(model), "version" if version_only else "probe"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProbeResult("error", f"the probe did not finish within {timeout:.0f} s")
    report: Dict[str, Optional[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith(_TAG):
            report.update(json.loads(line[len(_TAG):]))
    version, path = report.get("version"), report.get("path")
    if report.get("kind"):
        return ProbeResult(str(report["kind"]), str(report.get("message") or ""), version, path)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return ProbeResult("crash", f"the probe was killed by {name}", version, path)
    last = one_line(done.stderr).rsplit("; ", 1)[-1] if done.stderr.strip() else ""
    # Windows reports an access violation as exit status 0xC0000005, not a signal.
    return ProbeResult("crash", f"the probe exited with status {done.returncode}"
                       + (f" ({last})" if last else ""), version, path)


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
    if result.kind == "crash":
        build = identify()
        version = _backend_version(backend)
        raise EdgecapError(
            f"{where} crashed the probe under {backend} {version or ''}".rstrip()
            + f" ({result.message}; {build.describe()}): a libedgetpu/TFLite mismatch; "
            + _fix(build, backend)
        )
    raise EdgecapError(f"{where}: cannot open the EdgeTPU ({result.message}); check "
                       "`edgecap devices`, or run on cpu / emu-tpu:N")


def _fix(build: Build, backend: str) -> str:
    if build.kind == "coral-tf2.5":
        return ("Coral's libedgetpu 16.0 needs tflite_runtime below 2.12 (pip install "
                "'tflite-runtime<2.12', EDGECAP_BACKEND=tflite_runtime), or install a libedgetpu "
                "rebuilt for newer TFLite (github.com/feranick/libedgetpu)")
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
    _report(version=version, path=_loaded_path(library))
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
    try:
        interp = tfl.Interpreter(model_path=model or os.fspath(PROBE_MODEL),
                                 experimental_delegates=[delegate])
        interp.allocate_tensors()
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], np.zeros(d["shape"], dtype=d["dtype"]))
        interp.invoke()
    except (ValueError, RuntimeError) as exc:
        _report(kind="error", message=one_line(exc))
        return 1
    _report(kind="ok")
    return 0


def _child_main(argv: Sequence[str]) -> int:
    """Runs the probe child (``_CHILD``) on its positional arguments; returns its exit status."""
    library, device, backend, model, what = argv
    return _child_probe(library or library_name(), device, backend, model or None, what == "version")
