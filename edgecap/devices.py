"""Which devices exist: device strings as Coral users write them, and the devices present.

Device strings:

* ``cpu`` (``cpu:N`` names a further CPU worker thread),
* ``tpu:N``, and pycoral's ``:N``, ``usb``, ``usb:N``, ``pci``, ``pci:N``,
* ``emu-tpu:N``: an emulated EdgeTPU (see ``edgecap.stages``).

What runs a plan stage on a device is ``edgecap.stages``.
"""

from __future__ import annotations

import glob
import logging
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import psutil

from edgecap import interpreter, recognition
from edgecap.errors import ConfigError

# Coral USB Accelerator: Global Unichip before the runtime loads its firmware, Google after.
CORAL_USB_IDS = (("1a6e", "089a"), ("18d1", "9302"))
# Paths below a root directory, so discovery can be tested on fake device trees.
_SYSFS_USB = "sys/bus/usb/devices"
_APEX_DEVICES = "dev/apex_*"
_APEX_CLASS = "class/apex"  # below the sysfs root
# The apex driver's default trip points, in °C: from each one up it lowers the
# TPU clock one step (500 -> 250 -> 125 -> 62.5 MHz). google/gasket-driver
# src/apex_driver.c: DEFAULT_TRIP_POINT{0,1,2}_TEMP 85000/90000/95000 milli-°C,
# "Temperature points in milli C at which DFS is toggled"; module parameters
# trip_point{0,1,2}_temp change them, and sysfs shows them as
# /sys/class/apex/apex_N/trip_point{0,1,2}_temp, read when present.
APEX_TRIP_POINTS_C = (85.0, 90.0, 95.0)
# The device tree, where the kernel shows it (boards; a PC has none).
_DT_DIRS = ("proc/device-tree", "sys/firmware/devicetree/base")
_log = logging.getLogger("edgecap")

_DEVICE_RE = re.compile(r"^(?:(cpu|tpu|emu-tpu|usb|pci)(?::(\d+))?|:(\d+))$")


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device string.

    ``kind`` is ``cpu``, ``tpu`` or ``emu-tpu``; ``bus`` is ``usb`` or ``pci``
    when the user named one; ``index`` is N, or None for "the first".
    """

    kind: str
    index: Optional[int] = None
    bus: Optional[str] = None

    def __str__(self) -> str:
        name = self.bus or self.kind
        return name if self.index is None else f"{name}:{self.index}"

    @property
    def delegate_option(self) -> str:
        """The ``device`` option libedgetpu's delegate takes for this device."""
        if self.kind != "tpu":
            raise ValueError(f"{self} is not an EdgeTPU")
        if self.bus is not None:
            return str(self)
        return "" if self.index is None else f":{self.index}"


@dataclass(frozen=True)
class DeviceInfo:
    """One device present on this machine, as ``edgecap devices`` lists it.

    Attributes:
      device: ``cpu`` or ``tpu:N``.
      kind: ``cpu``, ``pci`` or ``usb``.
      path: Where it is (``/dev/apex_0``, a sysfs USB device).
      runtime: The interpreter and libedgetpu that would run it.
      temperature_c: A PCIe TPU's temperature, else None.
      throttled: Whether the apex driver slowed a PCIe TPU's clock; None unknown.
      state: A USB TPU's: ``dfu`` (its bootloader, 1a6e:089a: no firmware yet)
        or ``loaded`` (18d1:9302); None for others.
      speed_mbps: A USB TPU's link speed from sysfs (480: USB 2, 5000: USB 3), or None.
    """

    device: str
    kind: str
    path: str
    runtime: str
    temperature_c: Optional[float] = None
    throttled: Optional[bool] = None
    state: Optional[str] = None
    speed_mbps: Optional[int] = None


def parse_device(text: str) -> DeviceSpec:
    """Parses a device string as Coral users write it.

    Args:
      text: E.g. ``cpu``, ``tpu:1``, ``:0``, ``usb``, ``pci:0``, ``emu-tpu:1``.

    Returns:
      The ``DeviceSpec``.

    Raises:
      ConfigError: If the string is not a device string.
    """
    m = _DEVICE_RE.match(text.strip().lower()) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(
            f"device {text!r} not understood; use cpu, tpu:N, :N, usb[:N], pci[:N] or emu-tpu:N"
        )
    name, index, bare_index = m.groups()
    if bare_index is not None:
        return DeviceSpec("tpu", int(bare_index))
    idx = None if index is None else int(index)
    if name in ("usb", "pci"):
        return DeviceSpec("tpu", idx, bus=name)
    if name == "tpu" and idx is None:
        idx = 0
    return DeviceSpec(name, idx)


def cpu_cores() -> int:
    """Returns the physical CPU cores: interpreter threads beyond them only contend."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class Hardware:
    """What this machine is, for choosing a plan: the board and the EdgeTPUs attached.

    Attributes:
      model: The device-tree model string, or None (no device tree: a PC).
      family: What the recognition rules call the board by its device tree
        (``Coral Dev Board``, ``Raspberry Pi 5``), or None.
      tpus: The attached EdgeTPUs, in libedgetpu's order.
      compatible: The device tree's ``compatible`` strings.
    """

    model: Optional[str]
    family: Optional[str]
    tpus: Tuple[DeviceInfo, ...]
    compatible: Tuple[str, ...] = ()

    @property
    def recognised(self) -> Optional[recognition.Recognised]:
        """The board profile this hardware is recognised as (``edgecap.recognition``), or None."""
        return recognition.recognise(self.model, self.compatible, self.tpus)

    @property
    def profile(self) -> Optional[str]:
        """The name of the board profile whose plans fit this hardware, or None if no profile does."""
        found = self.recognised
        return found.profile if found else None

    def describe(self) -> str:
        """One line: the board and its EdgeTPUs."""
        board = self.family or "this machine"
        if self.model and self.family:
            board += f" ({self.model})"
        tpus = ", ".join(f"{t.kind}:{t.path}" + (f" ({t.speed_mbps} Mbit/s)" if t.speed_mbps else "")
                         for t in self.tpus) or "no EdgeTPU"
        return f"{board} with {tpus}"


def detect_hardware(root: "str | os.PathLike[str]" = "/") -> Hardware:
    """Finds the board and the attached EdgeTPUs, every USB TPU out of its bootloader first.

    A board that is mapped to the nearest profile (it has none of its own)
    logs one warning saying so.

    Args:
      root: The filesystem root to look under (tests pass a fake device tree).

    Returns:
      The ``Hardware``.
    """
    root = Path(root)
    model, compatible = _device_tree(root)
    hardware = Hardware(model, recognition.board_name(model, compatible),
                        tuple(list_devices(root, wake=True)[1:]), compatible)
    found = hardware.recognised
    if found is not None and found.nearest:
        _log.warning("edgecap: %s", found.nearest)
    return hardware


def _device_tree(root: Path) -> Tuple[Optional[str], Tuple[str, ...]]:
    """The device tree's model and compatible strings, from the first place that shows it."""
    for rel in _DT_DIRS:
        base = root / rel
        if not base.is_dir():
            continue
        try:
            model = (base / "model").read_bytes().rstrip(b"\0\n").decode(errors="replace").strip()
        except OSError:
            model = ""
        try:
            raw = (base / "compatible").read_bytes()
        except OSError:
            raw = b""
        return model or None, tuple(c.decode(errors="replace") for c in raw.split(b"\0") if c)
    return None, ()


def list_devices(root: "str | os.PathLike[str]" = "/", wake: bool = False) -> List[DeviceInfo]:
    """Lists the CPU and the EdgeTPUs present on this machine, ``tpu:N`` as libedgetpu's ``:N``.

    At ``/`` the EdgeTPUs are libedgetpu's own list (``edgetpu_list_devices``),
    read in a child process so that libedgetpu never loads in this one
    (``edgecap.edgetpu_runtime.enumerate_tpus``). Elsewhere, or without
    libedgetpu, they are read from the files as libedgetpu orders them: PCIe
    (``/dev/apex_N``), then USB TPUs in their bootloader (1a6e:089a), then
    those running their firmware (18d1:9302), each group in sysfs name order
    (libedgetpu's order within a group is libusb's, which the files do not show).

    Args:
      root: The filesystem root to look under (tests and ``edgecap devices
        --root`` pass a copy of a board's files).
      wake: At ``/``, bring every USB TPU out of its bootloader first, so that
        the indices hold while stages open (libedgetpu moves a TPU behind the
        others when its firmware loads).

    Returns:
      One ``DeviceInfo`` for the CPU, then one per EdgeTPU.
    """
    from edgecap import edgetpu_runtime  # the probe child: never loads libedgetpu here

    root = Path(root)
    backend = f"{interpreter.BACKEND} {interpreter.backend_version()}"
    cpu = DeviceInfo(
        device="cpu",
        kind="cpu",
        path=(f"{platform.machine()} {cpu_cores()} cores, "
              f"{psutil.virtual_memory().total / 2**30:.1f} GiB"),
        runtime=backend,
    )
    library = edgetpu_runtime.resolve_library(edgetpu_runtime.library_name()) if root == Path("/") else None
    runtime = f"{backend}; " + (f"libedgetpu {library}" if library else "libedgetpu not found")
    found = edgetpu_runtime.enumerate_tpus(wake=wake) if library is not None else None
    if found is None:
        found = _from_files(root)
    infos = [cpu]
    for n, (kind, path) in enumerate(found):
        state = thermal(path, root / "sys")
        link = _usb_link(Path(path)) if kind == "usb" else None
        infos.append(DeviceInfo(f"tpu:{n}", kind, path, runtime,
                                None if state is None else state.temperature_c,
                                None if state is None else state.throttled,
                                link.state if link else None, link.speed_mbps if link else None))
    return infos


@dataclass(frozen=True)
class _UsbLink:
    state: Optional[str]  # "dfu", "loaded", or None (not a Coral USB device)
    speed_mbps: Optional[int]


def _usb_link(dev: Path) -> _UsbLink:
    """A USB device's Coral state and link speed, from its sysfs directory."""
    try:
        ids = ((dev / "idVendor").read_text().strip(), (dev / "idProduct").read_text().strip())
    except OSError:
        ids = ("", "")
    try:
        speed: Optional[int] = int(float((dev / "speed").read_text().strip()))
    except (OSError, ValueError):
        speed = None
    state = {CORAL_USB_IDS[0]: "dfu", CORAL_USB_IDS[1]: "loaded"}.get(ids)  # type: ignore[call-overload]
    return _UsbLink(state, speed)


def _from_files(root: Path) -> List[Tuple[str, str]]:
    """The EdgeTPUs under ``root`` in libedgetpu's order: PCIe, USB in DFU, USB loaded."""
    apex = sorted(glob.glob(str(root / _APEX_DEVICES)), key=lambda p: int(re.search(r"(\d+)$", p).group(1)))
    usb = {"dfu": [], "loaded": []}  # type: Dict[str, List[str]]
    for dev in sorted((root / _SYSFS_USB).glob("*")):
        state = _usb_link(dev).state
        if state is not None:
            usb[state].append(str(dev))
    return [("pci", p) for p in apex] + [("usb", p) for p in usb["dfu"] + usb["loaded"]]


@dataclass(frozen=True)
class TpuThermal:
    """A PCIe EdgeTPU's temperature and the apex driver's throttling of it.

    Attributes:
      name: The apex device, ``apex_N``.
      temperature_c: Die temperature in °C.
      trip_points_c: The driver's throttle temperatures, lowest first (sysfs,
        or ``APEX_TRIP_POINTS_C`` when the driver does not show them).
      level: Trip points reached: 0 runs at full clock, 1-3 at 1/2, 1/4, 1/8.
    """

    name: str
    temperature_c: float
    trip_points_c: Tuple[float, ...] = APEX_TRIP_POINTS_C
    level: int = 0

    @property
    def throttled(self) -> bool:
        """True when the driver has lowered the TPU's clock: its times exceed the plan's."""
        return self.level > 0


def apex_thermal(apex_dir: "str | os.PathLike[str]") -> Optional[TpuThermal]:
    """Reads one apex device's temperature and trip points from sysfs.

    Args:
      apex_dir: ``<sysfs>/class/apex/apex_N``.

    Returns:
      The ``TpuThermal``, or None when the temperature does not read (no
      such TPU, a TPU mid-reset, a driver without the attribute).
    """
    apex_dir = Path(apex_dir)
    celsius = _millis(apex_dir / "temp")
    if celsius is None:
        return None
    trips = tuple(_millis(apex_dir / f"trip_point{i}_temp") for i in range(len(APEX_TRIP_POINTS_C)))
    points = tuple(t if t is not None else d for t, d in zip(trips, APEX_TRIP_POINTS_C))
    return TpuThermal(apex_dir.name, celsius, points, sum(1 for t in points if celsius >= t))


def thermal(path: str, sysfs: "str | os.PathLike[str]" = "/sys") -> Optional[TpuThermal]:
    """Returns a PCIe EdgeTPU's temperature and throttle state, or None (USB TPUs report none).

    Args:
      path: The TPU's device path, ``/dev/apex_N``, as ``list_devices`` gives it.
      sysfs: The sysfs root (tests pass a fake one).
    """
    m = re.search(r"apex_(\d+)$", path)
    return None if m is None else apex_thermal(Path(sysfs) / _APEX_CLASS / f"apex_{m.group(1)}")


def tpu_thermals(sysfs: "str | os.PathLike[str]" = "/sys") -> List[TpuThermal]:
    """Returns the temperature and throttle state of every PCIe EdgeTPU whose temperature reads.

    Args:
      sysfs: The sysfs root (tests pass a fake one).

    Returns:
      One ``TpuThermal`` per ``apex_N``, in N order.
    """
    apex = Path(sysfs) / _APEX_CLASS
    try:
        names = [p.name for p in apex.iterdir() if re.fullmatch(r"apex_\d+", p.name)]
    except OSError:  # no apex driver loaded: no PCIe TPU
        return []
    found = (apex_thermal(apex / n) for n in sorted(names, key=lambda n: int(n[5:])))
    return [t for t in found if t is not None]


class ThrottleWatch:
    """Logs one warning when a TPU starts throttling, and one line when it stops.

    Args:
      log: Where the lines go.
    """

    def __init__(self, log: logging.Logger = logging.getLogger("edgecap")) -> None:
        self._log = log
        self._throttled: Dict[str, bool] = {}

    def update(self, device: str, state: Optional[TpuThermal]) -> bool:
        """Records a TPU's state; logs on a change of throttling.

        Args:
          device: The TPU as the caller names it (``tpu:0``).
          state: Its thermal state, or None when unknown (nothing is logged).

        Returns:
          Whether the TPU is throttled now (False when unknown).
        """
        if state is None:
            return False
        before = self._throttled.get(device, False)
        self._throttled[device] = state.throttled
        if state.throttled and not before:
            trip = state.trip_points_c[state.level - 1]
            self._log.warning(
                "edgecap: %s (%s) is throttling at %.1f C (trip point %.0f C): the driver slowed "
                "its clock to 1/%d and stage times exceed the plan; cool the board",
                device, state.name, state.temperature_c, trip, 2 ** state.level)
        elif before and not state.throttled:
            self._log.info("edgecap: %s (%s) no longer throttled at %.1f C", device, state.name,
                           state.temperature_c)
        return state.throttled


def _millis(path: Path) -> Optional[float]:
    try:
        return int(path.read_text().strip()) / 1000.0
    except (OSError, ValueError):
        return None
