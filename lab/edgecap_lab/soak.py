"""The soak: a long pipelined run on an emulated board, with faults injected as it goes.

The command is a developer script (``run_soak`` is what it calls)::

    python tools/soak.py --frames 50000 --json results/soak.json --md results/soak.md

It captions ``--frames`` sampled frames (the demo clip, repeated) through the
pipelined runtime on the emulated ``devboard-usb`` (emulated EdgeTPUs, real
compute, paced to the board's plan), injecting a fault every
``--fault-every`` frames: ``fail``, ``hang`` and ``vanish`` in turn, each on
an EdgeTPU the running plan uses (its TPU workers in turn: the plan changes
as devices fail and return, and a fault on a device the plan leaves idle
would never fire), each device answering probes again ``--back`` s later, so
the runtime fails over and takes the device back again and again. A fault
waits, if it must, until the one before has fired and the running plan has
an EdgeTPU; one whose device the plan leaves before it fires (a device taken
back) moves to the plan's EdgeTPU. It measures:

* resident memory (psutil) after ``--warmup`` frames and at the end: growth
  goal under 5 %;
* threads, open file descriptors and child processes of the process before
  the captioner is made and after it is closed, with no garbage collection
  forced: no leak;
* every window accounted for: one caption per complete window, numbered
  0..n-1 once each, and each equal to the fault-free caption of the same
  frames (the clip repeats whole windows, so a fault-free run of a few
  repeats is the reference; the soak checks that it does repeat);
* every fault fired: each one injected was taken by its device's invoke;
* each failover's time, from the runtime learning of the fault to the first
  frame out of the new plan's pipeline (host-measured, under the host's load).

It prints a table and writes the figures as JSON (and a Markdown page).
Board figures are *modelled* (emulated TPUs); memory, threads, descriptors and
failover times are *measured* on this host.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from edgecap import faults
from edgecap.bundle import default_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.errors import ConfigError
from edgecap.sources import open_source
from edgecap.stats import summarize

ACTIONS = ("fail", "hang", "vanish")
RSS_GOAL = 0.05


@dataclass
class SoakResult:
    """The soak's figures (``--json`` writes them)."""

    frames: int
    windows_expected: int
    captions: int
    windows_in_order: bool
    captions_match_fault_free: bool
    mismatches: int
    faults_planned: int
    faults_injected: List[str]
    faults_fired: int
    failovers: List[Dict[str, Any]]
    failover_ms: Dict[str, float]
    return_ms: Dict[str, float]
    rss_mb: Dict[str, float]
    rss_growth: float
    threads: Dict[str, int]
    fds: Dict[str, int]
    processes: Dict[str, int]
    elapsed_s: float
    fps: float
    replayed: int
    dropped: int
    host: Dict[str, Any] = field(default_factory=dict)

    @property
    def missed(self) -> List[str]:
        """The goals not met (none: the soak passed)."""
        goals = [
            ("every window captioned", self.captions == self.windows_expected),
            ("windows in order, once each", self.windows_in_order),
            ("captions equal to the fault-free run's", self.captions_match_fault_free),
            (f"RSS growth under {100 * RSS_GOAL:.0f} %", self.rss_growth < RSS_GOAL),
            ("every planned fault fired",
             self.faults_fired == len(self.faults_injected) == self.faults_planned),
            ("no thread left", self.threads["after"] <= self.threads["before"]),
            ("no file descriptor left", self.fds["after"] <= self.fds["before"]),
            ("no child process left", self.processes["after"] <= self.processes["before"]),
        ]
        return [name for name, met in goals if not met]

    @property
    def ok(self) -> bool:
        """Whether every goal is met."""
        return not self.missed


def fault_schedule(frames: int, every: int) -> List[Tuple[int, str]]:
    """The faults of a soak: ``(frame, action)``, one every ``every`` frames, fail/hang/vanish in turn."""
    return [((i + 1) * every, ACTIONS[i % len(ACTIONS)]) for i in range(frames // every - 1)]


class _Injector:
    """Injects a soak's faults one at a time, each on an EdgeTPU the running plan uses.

    Fed by the frame iterator (on the pipeline's feeder thread): at a fault's
    frame it picks the running plan's TPU workers in turn and adds the fault
    to the process's fault plan at that device's next invoke (added, not
    injected anew: a device still away after an earlier fault stays away). A
    fault waits until the one before has fired, and until the plan has an
    EdgeTPU (after a failover onto the CPU alone, until one returns). A fault
    that has not fired when the plan moves off its device (a device taken
    back) is moved onto the running plan's EdgeTPU: left there, it could never
    fire, and every later fault would wait on it.

    Args:
      cap: The captioner (its ``choice`` is the running plan's).
      schedule: ``fault_schedule``'s list.
      back_s: Seconds after a fault when its device answers again.
    """

    def __init__(self, cap: EdgeCaptioner, schedule: List[Tuple[int, str]], back_s: float) -> None:
        self._cap = cap
        self._schedule = schedule
        self._back_s = back_s
        self._plan = faults.current()
        self.injected: List[str] = []
        self._faults: List[faults.Fault] = []  # each injected fault (as it stands after a move)
        self.moved = 0

    @property
    def fired(self) -> int:
        """How many of the injected faults fired."""
        pending = self._plan.pending
        return sum(1 for fault in self._faults if fault not in pending)

    def frames(self, images: Sequence[np.ndarray], n: int) -> Iterator[np.ndarray]:
        """Yields ``n`` frames (``images`` repeated), injecting each fault when its time comes."""
        for i in range(n):
            k = len(self.injected)
            if self._faults:
                self._follow()
            if k < len(self._schedule) and i >= self._schedule[k][0]:
                self._inject(k, i)
            yield images[i % len(images)]

    def _fault(self, device: str, action: str) -> faults.Fault:
        # At the device's next invoke: its invokes are counted over its life.
        return faults.Fault(device, action, self._plan.invokes(device), self._back_s)

    def _follow(self) -> None:
        """Moves the latest fault, not yet fired, off a device the running plan no longer uses."""
        fault = self._faults[-1]
        tpus = [str(d) for d in self._cap.choice.tpus]
        if not tpus or fault.device in tpus or not self._plan.withdraw(fault):
            return
        moved = self._fault(tpus[0], fault.action)
        self._plan.add(moved)
        self._faults[-1] = moved
        self.injected[-1] += f" -> {moved.device} (its device left the plan)"
        self.moved += 1

    def _inject(self, k: int, frame: int) -> None:
        if self._faults and self._faults[-1] in self._plan.pending:
            return  # the fault before has not fired
        tpus = [str(d) for d in self._cap.choice.tpus]
        if not tpus:
            return
        fault = self._fault(tpus[k % len(tpus)], self._schedule[k][1])
        self._plan.add(fault)
        self._faults.append(fault)
        self.injected.append(f"{fault} (frame {frame})")


def run_soak(frames: int = 50_000, every: int = 4_000, back_s: float = 2.0, warmup: int = 5_000,
             bundle: Optional[str] = None, board: str = "devboard-usb", deadline_floor_s: float = 0.5,
             progress: Optional[Any] = None) -> SoakResult:
    """Runs the soak.

    Args:
      frames: Sampled frames to caption.
      every: Frames between two faults (a fault may wait longer, see ``_Injector``).
      back_s: Seconds after a fault when its device answers probes again.
      warmup: Frames before the first memory reading.
      bundle: The bundle (default: the shipped demo).
      board: The board profile to emulate.
      deadline_floor_s: ``CaptionerOptions.deadline_floor_s`` (a hang is noticed after it).
      progress: Called with a line now and then (e.g. ``print``).

    Returns:
      The ``SoakResult``.

    Raises:
      ConfigError: If the numbers make no soak (fewer frames than a window, ...).
    """
    import psutil  # a dependency of edgecap; imported here so the module loads without it

    if frames < 1 or every < 1 or warmup >= frames:
        raise ConfigError(f"soak: {frames} frames, a fault every {every}, warm-up {warmup}: give "
                          "more frames than the warm-up, and positive numbers")
    say = progress or (lambda line: None)
    root = bundle or str(default_bundle())
    clip = Path(root).parent / "sample.mp4"
    images = [f.image for f in open_source(str(clip if clip.is_file() else default_bundle().parent / "sample.mp4"))]
    proc = psutil.Process()
    faults.inject("")
    opts = dict(board=board, num_threads=1, deadline_floor_s=deadline_floor_s)
    spec, period, reference = _fault_free(root, opts, images)
    time.sleep(0.5)  # the reference's threads end
    # No gc.collect() here or after: what a failover leaves must be released, not collected.
    before = _resources(proc)
    schedule = fault_schedule(frames, every)
    say(f"soak: {frames} frames, {len(schedule)} faults, one every {every} frames on the plan's TPUs in turn")
    t0 = time.perf_counter()
    windows_expected = (frames - spec.frames) // spec.stride + 1 if frames >= spec.frames else 0
    with EdgeCaptioner(root, **opts) as cap:
        injector = _Injector(cap, schedule, back_s)
        captions, rss, during = _stream(cap, injector.frames(images, frames), warmup, proc, say)
        elapsed = time.perf_counter() - t0
        stats = cap.stats()
    faults.inject("")  # releases nothing left: every hang ended with its pipeline
    time.sleep(0.5)
    after = _resources(proc)
    numbers = [w for w, _ in captions]
    mismatches = sum(1 for w, text in captions if text != reference[w % period])
    return SoakResult(
        frames=frames,
        windows_expected=windows_expected,
        captions=len(captions),
        windows_in_order=numbers == list(range(len(numbers))),
        captions_match_fault_free=mismatches == 0,
        mismatches=mismatches,
        faults_planned=len(schedule),
        faults_injected=injector.injected,
        faults_fired=injector.fired,
        failovers=[{k: v for k, v in asdict(r).items() if k != "detail"} for r in stats.failovers],
        failover_ms=_took_ms(stats.failovers, returns=False),
        return_ms=_took_ms(stats.failovers, returns=True),
        rss_mb={k: round(v, 1) for k, v in rss.items()},
        rss_growth=round((rss["end"] - rss["warmup"]) / rss["warmup"], 4) if "warmup" in rss else float("nan"),
        threads={"before": before["threads"], "warmup": during.get("threads_warmup", -1),
                 "end": during["threads_end"], "after": after["threads"]},
        fds={"before": before["fds"], "after": after["fds"]},
        processes={"before": before["processes"], "after": after["processes"]},
        elapsed_s=round(elapsed, 1),
        fps=round(frames / elapsed, 1),
        replayed=stats.replayed,
        dropped=stats.dropped,
        host={"python": platform.python_version(), "machine": platform.machine(),
              "cpus": psutil.cpu_count(), "load_1min": round(psutil.getloadavg()[0], 2)},
    )


def _fault_free(root: str, opts: Dict[str, Any], images: List[np.ndarray]) -> Tuple[Any, int, List[str]]:
    """Captions the clip three times over without faults: the window spec, the captions' period, the captions.

    Raises:
      ConfigError: If the clip is not whole strides, or its captions do not repeat with it.
    """
    with EdgeCaptioner(root, **opts) as cap:
        spec = cap.window
        period = len(images) // spec.stride if len(images) % spec.stride == 0 and spec.frames <= len(images) else 0
        if not period:
            raise ConfigError(f"soak: the clip's {len(images)} frames are not whole strides of "
                              f"{spec.stride}; use a clip that repeats whole windows")
        reference = [c.text for c in cap.caption_frames(list(images) * 3)]
        if reference[:period] * (len(reference) // period) != reference:
            raise ConfigError("soak: the fault-free captions of the repeated clip do not repeat")
    return spec, period, reference


def _stream(cap: EdgeCaptioner, frames: Iterator[np.ndarray], warmup: int, proc: Any,
            say: Any) -> Tuple[List[Tuple[int, str]], Dict[str, float], Dict[str, int]]:
    """Captions ``frames``: the (window, text) pairs, RSS (MiB) and threads after warm-up and at the end."""
    rss: Dict[str, float] = {}
    during: Dict[str, int] = {}
    captions = []
    for c in cap.stream(frames, fps=0):
        captions.append((c.window, c.text))
        done = c.end_frame + 1
        if "warmup" not in rss and done >= warmup:
            rss["warmup"] = proc.memory_info().rss / 2**20
            during["threads_warmup"] = proc.num_threads()
        if c.window % 500 == 0:
            say(f"soak: {done} frames, {len(cap.stats().failovers)} failovers, "
                f"rss {proc.memory_info().rss / 2**20:.1f} MiB")
    rss["end"] = proc.memory_info().rss / 2**20
    during["threads_end"] = proc.num_threads()
    return captions, rss, during


def _resources(proc: Any) -> Dict[str, int]:
    return {"threads": proc.num_threads(), "fds": proc.num_fds(), "processes": len(proc.children())}


def _took_ms(failovers: Sequence[Any], returns: bool) -> Dict[str, float]:
    """Percentiles and the maximum of the failovers' (or, with ``returns``, the returns') times, in ms."""
    took = [1e3 * r.took_s for r in failovers if r.took_s is not None and (r.kind == "returned") == returns]
    return {k: round(v, 1) for k, v in summarize(took).items()} | ({"max": round(max(took), 1)} if took else {})


def table(r: SoakResult) -> str:
    """The soak's figures as a Markdown table."""
    kinds: Dict[str, int] = {}
    for f in r.failovers:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    struck: Dict[str, int] = {}
    for entry in r.faults_injected:
        device = entry.split("=")[0]
        struck[device] = struck.get(device, 0) + 1
    devices = ", ".join(f"{d} x{n}" for d, n in sorted(struck.items())) or "none"
    rows = [
        ("frames (sampled, demo clip repeated)", f"{r.frames}"),
        ("windows expected / captioned", f"{r.windows_expected} / {r.captions}"),
        ("window numbers 0..n-1, once each", "yes" if r.windows_in_order else "NO"),
        ("captions equal to the fault-free run's", "yes" if r.captions_match_fault_free
         else f"NO ({r.mismatches} differ)"),
        ("faults planned / injected / fired", f"{r.faults_planned} / {len(r.faults_injected)} / {r.faults_fired} "
         f"(fail, hang, vanish in turn, on the running plan's TPUs: {devices})"),
        ("plan changes (failovers + returns)", f"{len(r.failovers)}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))),
        ("failover time, ms (measured): p50 / p99 / max", _ms(r.failover_ms)),
        ("taking a device back, ms (measured): p50 / p99 / max", _ms(r.return_ms)),
        ("frames replayed (file mode: no window lost)", f"{r.replayed}"),
        ("RSS after warm-up -> end, MiB (measured)", f"{r.rss_mb.get('warmup', float('nan')):.1f} -> {r.rss_mb['end']:.1f} ({100 * r.rss_growth:+.2f} %, goal < {100 * RSS_GOAL:.0f} %)"),
        ("threads before / warm-up / end / after close", f"{r.threads['before']} / {r.threads['warmup']} / {r.threads['end']} / {r.threads['after']}"),
        ("open fds before / after", f"{r.fds['before']} / {r.fds['after']}"),
        ("child processes before / after", f"{r.processes['before']} / {r.processes['after']}"),
        ("run time, s / frames per s (host, loaded)", f"{r.elapsed_s} / {r.fps}"),
        ("goals", "all met" if r.ok else "NOT met: " + "; ".join(r.missed)),
    ]
    out = ["| figure | value |", "|---|---|"]
    out += [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(out)


def _ms(figures: Dict[str, float]) -> str:
    return " / ".join(f"{figures.get(k, float('nan')):.0f}" for k in ("p50", "p99", "max"))
