"""Process isolation: a plan stage run in a worker process, so its native crash is not ours.

libedgetpu answers a USB transfer error with ``abort()``, which would kill
the whole runtime. An ``IsolatedSegment`` runs its stage in a child process
instead: tensors go both ways through one shared-memory block sized from the
stage's tensor specs, and a socket carries only "invoke N" and "done N".
When the child dies (abort, segfault) or does not answer within its deadline
(hung; the child is then killed), the call raises ``DeviceFailed`` with kind
``crashed`` or ``hung``, and the failover re-plans without the device.

The child is a fresh interpreter (``subprocess``, fork and exec), not a fork
of this process: forking a process that runs TFLite threads is unsafe, and
multiprocessing's spawn and forkserver re-import the user's ``__main__``,
which would re-run a script without a ``__main__`` guard. It opens the stage
with ``edgecap.stages.open_stage`` as in-process (pacing included, so an
emulated device's pace is part of its invoke), ignores SIGINT and runs in its
own session (the parent owns shutdown), and exits when this process dies: a
thread in it waits for the end of a pipe only this process holds.

Starting an interpreter and importing numpy and TFLite takes most of a second,
more on a loaded host, and a failover opens a new stage: so a spare worker
process is started ahead of need (after a stage opens) and waits, imports
done, for the next stage to open (``spare_pids``, ``close_spares``,
``set_spares``).

The shared block has no name: an anonymous file (``memfd_create`` on Linux;
elsewhere a POSIX shared-memory object unlinked as soon as it is created),
handed to the child over the socket. Nothing is left in ``/dev/shm`` however
the processes end, ``kill -9`` included: the kernel frees the block when the
last process that maps it exits. POSIX only.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import mmap
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgecap import errors, faults, stages
from edgecap.devices import DeviceSpec
from edgecap.errors import DeviceFailed, EdgecapError, RunCancelled
from edgecap.modelfile import TensorSpec
from edgecap.plans.plan import Stage
from edgecap.scheduler import sleep_until
from edgecap.stages import Tensors

SUPPORTED = os.name == "posix"

# Opening includes the child's interpreter start-up, imports and, on a real
# TPU, libedgetpu's probe and the delegate.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 2.0
# A stopped run has no file descriptor to wait on beside the child's socket:
# a waiting call looks at it this often.
_RECHECK_S = 0.1
_ALIGN = 64

_CHILD = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
          "from edgecap.isolation import _worker_main; _worker_main()")


@dataclass(frozen=True)
class _Slot:
    """Where one tensor lives in the shared block."""

    name: str
    offset: int
    shape: Tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _layout(specs: Sequence[TensorSpec], start: int) -> Tuple[List[_Slot], int]:
    slots, at = [], start
    for spec in specs:
        slot = _Slot(spec.name, at, tuple(spec.shape), spec.dtype)
        slots.append(slot)
        at += -(-slot.nbytes // _ALIGN) * _ALIGN
    return slots, at


def _views(buf: Any, slots: Sequence[_Slot]) -> Dict[str, np.ndarray]:
    return {s.name: np.ndarray(s.shape, s.dtype, buffer=buf, offset=s.offset) for s in slots}


@dataclass(frozen=True)
class _OpenRequest:
    """What the child needs to open its stage: sent as its first message, the block's file after it."""

    stage: Stage
    spec: DeviceSpec
    num_threads: int
    timing_only: bool
    pace_ms: Optional[float]
    size: int
    inputs: Tuple[_Slot, ...]
    outputs: Tuple[_Slot, ...]


def _anonymous_block(size: int) -> int:
    """A file descriptor of ``size`` bytes of shared memory that has no name to leave behind."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("edgecap-isolation")
    else:  # macOS: a name for the two system calls between creating and unlinking it
        import _posixshmem

        name = f"/edgecap-{os.getpid()}-{secrets.token_hex(8)}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        _posixshmem.shm_unlink(name)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _send_fd(conn: Connection, fd: int) -> None:
    with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        socket.send_fds(sock, [b"\0"], [fd])


def _recv_fd(conn: Connection) -> int:
    with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if len(fds) != 1:
        raise EOFError("no shared block came with the request")
    return fds[0]


def _surroundings() -> Tuple[Dict[str, str], Optional[str]]:
    """What a child started now inherits that its stage's opening reads: environment, directory."""
    try:
        cwd: Optional[str] = os.getcwd()
    except OSError:  # removed: a child started now inherits a directory that has no path
        cwd = None
    return dict(os.environ), cwd


class _Process:
    """A started worker process with no stage yet: its socket and lifeline; ``stop()`` ends it.

    Its environment and working directory are this process's when it
    started: a spare is used only while they are still the same.
    """

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        lifeline_r, self._lifeline = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(theirs.fileno()), str(lifeline_r)],
                pass_fds=(theirs.fileno(), lifeline_r), start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            os.close(self._lifeline)
            raise
        finally:
            theirs.close()
            os.close(lifeline_r)
        self.conn = Connection(ours.detach())
        self._started_in = _surroundings()
        self._lock = threading.Lock()
        self._stopped = False

    def fits(self) -> bool:
        """Whether it still runs and would open a stage as one started now would."""
        return self.proc.poll() is None and _surroundings() == self._started_in

    def stop(self, kill: bool = False) -> None:
        """Ends the child (closing its lifeline makes it exit) and reaps it; idempotent.

        Args:
          kill: Kill it at once: for a spare, which holds no device and may
            still be importing (it reads its lifeline only after its imports).
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        os.close(self._lifeline)
        self.conn.close()
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # stuck in the kernel (a USB transfer): reaped when it ends
                pass


class _Spares:
    """Worker processes started ahead of need, each waiting (imports done) for a stage to open.

    ``take()`` hands out a spare that fits, else starts a process; ``refill()``
    starts spares up to ``size``. Thread-safe; stopped at exit.
    """

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self._idle: List[_Process] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> Tuple[_Process, bool]:
        """Returns a worker process for a stage, and whether it was a spare."""
        with self._lock:
            stale = [p for p in self._idle if not p.fits()]
            self._idle = [p for p in self._idle if p not in stale]
            chosen = self._idle.pop(0) if self._idle else None
        for process in stale:
            process.stop(kill=True)
        return (chosen, True) if chosen is not None else (_Process(), False)

    def refill(self) -> None:
        """Starts spares up to ``size`` (a failure to start one is left to the next ``take``)."""
        while True:
            with self._lock:
                if self._closed or len(self._idle) >= self.size:
                    return
            try:
                process = _Process()
            except OSError:
                return
            with self._lock:
                if not self._closed and len(self._idle) < self.size:
                    self._idle.append(process)
                    continue
            process.stop(kill=True)
            return

    def pids(self) -> List[int]:
        """The spare processes' ids."""
        with self._lock:
            return [p.proc.pid for p in self._idle]

    def close(self, final: bool = False) -> None:
        """Stops every spare; with ``final``, starts none again."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = self._closed or final
        for process in idle:
            process.stop(kill=True)


_SPARES = _Spares()
atexit.register(_SPARES.close, final=True)


def spare_pids() -> List[int]:
    """The process ids of the spare worker processes (started after an isolated stage opens)."""
    return _SPARES.pids()


def close_spares() -> None:
    """Stops the spare worker processes; the next isolated stage starts its own and a new spare."""
    _SPARES.close()


def set_spares(size: int) -> None:
    """Sets how many spare worker processes are kept (default 1; 0 starts each at need).

    Raises:
      ConfigError: If ``size`` is not 0 or more.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise errors.ConfigError(f"spare worker processes: {size!r}; use 0 or more")
    _SPARES.size = size
    if size == 0:
        _SPARES.close()


class _Worker:
    """A worker process given a stage, and the block it shares with it; ``stop()`` releases both.

    Held apart from ``IsolatedSegment`` so the segment's finalizer can stop it.
    """

    def __init__(self, request: _OpenRequest, process: _Process) -> None:
        self.process = process
        self.proc, self.conn = process.proc, process.conn
        fd = _anonymous_block(request.size)
        try:
            self.block = mmap.mmap(fd, request.size)
            self.inputs = _views(self.block, request.inputs)
            self.outputs = _views(self.block, request.outputs)
            try:  # read by the child once its imports are done
                self.conn.send(request)
                _send_fd(self.conn, fd)
            except OSError:  # it died (a spare killed while it waited): the wait for its answer says how
                pass
        finally:
            os.close(fd)
        # One poll object for every wait: multiprocessing's wait() builds a
        # selector per call, a good part of the round trip's cost.
        self.poller = select.poll()
        self.poller.register(self.conn.fileno(), select.POLLIN)

    def exit_detail(self) -> str:
        """How the child ended (it has, or is about to): reaps it and names the signal."""
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "worker process closed its socket but did not exit"
        if code < 0:
            try:
                return f"worker process killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker process killed by signal {-code}"
        return f"worker process exited with status {code}"

    def stop(self) -> None:
        """Ends the child, reaps it and unmaps the block; idempotent."""
        self.process.stop()
        self.inputs = self.outputs = {}
        try:
            self.block.close()
        except BufferError:  # a view still held by a call in flight: the map goes with the view
            pass


class IsolatedSegment:
    """A plan stage run in a worker process; a crash or hang there raises ``DeviceFailed`` here.

    Call it from one thread at a time (the thread that owns the stage);
    ``close()`` may come from any thread. After a crash or hang the child is
    gone and every later call raises the same ``DeviceFailed``.

    Attributes:
      isolated: True: ``__call__`` takes ``fault=`` and performs it in the child.
      device: The device string, as ``DeviceFailed`` names it.
      deadline_s: Seconds an invoke after the first may take before the
        child counts as hung (the first may take ``first_deadline_s``).
      first_deadline_s: Seconds the first invoke may take.
      startup_s: Seconds from asking for a child (a spare, or one started
        then) to its stage being open.
      pid: The child's process id.
      spare: Whether the child was a spare, started before this stage opened.
      paced_ms: A paced stage's last invoke as its pace in the child made it
        (``SegmentRunner.paced_ms``), None for an unpaced one: the time seen
        here adds this host's load and the hand-over.
    """

    isolated = True
    paced_ms: Optional[float] = None

    def __init__(self, stage: Stage, spec: DeviceSpec, *, deadline_s: float, num_threads: int = 1,
                 timing_only: bool = False, pace_ms: Optional[float] = None,
                 first_deadline_s: Optional[float] = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        """Starts the child and opens ``stage`` in it (see ``edgecap.stages.open_stage``).

        Args:
          stage: The plan stage.
          spec: The device to open it on in the child.
          deadline_s: Seconds an invoke may take before the child counts as
            hung and is killed (the planner's, ``edgecap.planner.deadlines``).
          num_threads, timing_only, pace_ms: As ``open_stage`` takes them.
          first_deadline_s: The first invoke's deadline (default: ``deadline_s``).
          start_timeout_s: Seconds the child may take to open the stage.

        Raises:
          ConfigError: If the system is not POSIX or the deadline is not positive.
          EdgecapError: The subclass (and one-line message) the stage's opening
            raises in-process, e.g. ``PlanError`` for a corrupt segment.
          DeviceFailed: If the child crashes or hangs while opening the stage.
        """
        if not SUPPORTED:
            raise errors.ConfigError(f"{spec}: process isolation needs a POSIX system; "
                                     "run the stage without isolation")
        deadline = float(deadline_s)
        if not deadline > 0:
            raise errors.ConfigError(f"{spec}: deadline_s={deadline_s!r}; use a positive number of seconds")
        first = deadline if first_deadline_s is None else float(first_deadline_s)
        if not first > 0:
            raise errors.ConfigError(f"{spec}: first_deadline_s={first_deadline_s!r}; "
                                     "use a positive number of seconds")
        self.device = str(spec)
        self.deadline_s = deadline
        self.first_deadline_s = first
        self._stage_index = stage.index
        ins = {t.name for t in stage.inputs}
        # Tensors that pass the stage by are handed on here: the child never writes them back.
        self._names = [(t.name, t.name in ins) for t in stage.outputs]
        in_slots, end = _layout(stage.inputs, 0)
        out_slots, size = _layout([t for t in stage.outputs if t.name not in ins], end)
        request = _OpenRequest(stage, spec, num_threads, timing_only, pace_ms, max(size, 1),
                               tuple(in_slots), tuple(out_slots))
        t0 = time.perf_counter()
        try:
            process, self.spare = _SPARES.take()
        except OSError as exc:
            raise EdgecapError(f"{spec}: cannot start the stage's worker process ({exc}); "
                               "run without process isolation") from None
        # TPU stages open one at a time across worker processes too (stages.tpu_opening).
        with stages.tpu_opening() if spec.kind == "tpu" else contextlib.nullcontext():
            try:
                worker = _Worker(request, process)
            except BaseException:
                process.stop(kill=True)  # no stage is open in it
                raise
            self._worker = worker
            self._finalizer = weakref.finalize(self, worker.stop)
            self.pid = worker.proc.pid
            self._seq = 0
            self._busy_until = 0.0  # the deadline of a request a stopped run left in flight
            self._failure: Optional[Tuple[str, str]] = None
            self._closed = False
            try:
                reply = self._wait(0, time.perf_counter() + start_timeout_s, start_timeout_s, opening=True)
            except BaseException:
                self.close()
                raise
        self.startup_s = time.perf_counter() - t0
        # Now, not before: the spare's start-up does not slow this stage's.
        _SPARES.refill()
        if reply[0] == "error":
            self.close()
            raise _rebuild(reply[1], self.device, opening=f"opening stage {stage.index}")

    def __call__(self, tensors: Tensors, fault: Optional[faults.Fault] = None) -> Tensors:
        """Runs the stage on ``tensors`` in the child.

        Args:
          tensors: At least the stage's inputs, by name.
          fault: An injected fault (``edgecap.faults``) the child performs before the invoke.

        Returns:
          The stage's outputs, by name, in the plan's order.

        Raises:
          DeviceFailed: ``crashed`` if the child died, ``hung`` if it did not
            answer within ``deadline_s`` (it is killed), ``error`` if the
            invoke raised; or the injected fault's own.
          RunCancelled: If the pipeline run this call works for was stopped.
        """
        self._check_usable()
        worker = self._worker
        for name, view in worker.inputs.items():
            np.copyto(view, tensors[name], casting="no")
        self._seq += 1
        limit = self.first_deadline_s if self._seq == 1 else self.deadline_s
        now = time.perf_counter()
        deadline = max(now, self._busy_until) + limit
        try:
            worker.conn.send((self._seq, fault))
        except OSError:
            self._check_usable()
            self._fail("crashed", worker.exit_detail())
        reply = self._wait(self._seq, deadline, limit)
        if reply[0] == "raised":
            raise _rebuild(reply[2], self.device)
        self.paced_ms = reply[2]
        return {name: tensors[name] if passing else worker.outputs[name].copy()
                for name, passing in self._names}

    def close(self) -> None:
        """Stops the child and frees the shared memory; idempotent, from any thread."""
        self._closed = True
        self._finalizer()

    def _check_usable(self) -> None:
        if self._closed:
            raise RunCancelled(f"{self.device}: stage {self._stage_index} is closed")
        if self._failure is not None:
            raise DeviceFailed(self.device, *self._failure)

    def _fail(self, kind: str, detail: str, opening: bool = False) -> None:
        if opening:
            detail += f" while opening stage {self._stage_index}"
        self._failure = (kind, detail)
        self._finalizer()
        raise DeviceFailed(self.device, kind, detail)

    def _wait(self, seq: int, deadline: float, limit_s: float, opening: bool = False) -> tuple:
        """Waits for the child's answer to request ``seq``; answers to older ones are dropped."""
        conn, poller = self._worker.conn, self._worker.poller
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                self._worker.proc.kill()
                self._check_usable()
                self._fail("hung", f"no answer within {limit_s:g} s; worker process killed", opening)
            try:
                ready = poller.poll(math.ceil(min(remaining, _RECHECK_S) * 1000))
                reply = conn.recv() if ready else None
            except (EOFError, OSError):
                self._check_usable()
                self._fail("crashed", self._worker.exit_detail(), opening)
            if reply is None:
                # sleep_until of a past deadline only says whether the run goes on.
                if not opening and not sleep_until(0.0):
                    self._busy_until = deadline
                    raise RunCancelled(f"{self.device}: run stopped during stage {self._stage_index}")
                continue
            if opening or reply[1] == seq:
                self._busy_until = 0.0
                return reply


def _describe(exc: BaseException) -> Tuple[str, str, Tuple[str, ...]]:
    """An exception as plain data: its class name, its message, and DeviceFailed's fields."""
    if isinstance(exc, DeviceFailed):
        detail = str(exc)[len(f"{exc.device}: {exc.kind}: "):]
        return "DeviceFailed", str(exc), (exc.device, exc.kind, detail)
    return type(exc).__name__, str(exc), ()


def _rebuild(described: Tuple[str, str, Tuple[str, ...]], device: str,
             opening: Optional[str] = None) -> EdgecapError:
    """The exception to raise here for one the child reported.

    edgecap's own errors come back as themselves. Anything else is a failure
    of the device's invoke (``DeviceFailed``, kind ``error``), or while
    opening, an ``EdgecapError`` naming it.
    """
    name, message, fields = described
    if name == "DeviceFailed":
        return DeviceFailed(*fields)
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, EdgecapError) and cls is not DeviceFailed:
        return cls(message)
    if opening is not None:
        return EdgecapError(f"{device}: {opening} in its worker process failed ({name}: {message}); "
                            "run it without process isolation to see the traceback")
    return DeviceFailed(device, "error", f"{name}: {message}")


# ---------------------------------------------------------------- the child


def _exit_when_orphaned(lifeline: int) -> None:
    # Only the parent holds the pipe's other end: EOF means it closed it or died.
    while os.read(lifeline, 1):
        pass
    os._exit(0)


def _perform(fault: faults.Fault) -> None:
    if fault.action in ("abort", "segv"):
        import resource

        # An injected crash is not worth a core file.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # An injected hang here is never released: the parent's deadline kills us.
    faults.perform(fault, released=threading.Event())


def _worker_main() -> None:
    """The child: opens its stage, then runs one invoke per request until the socket closes."""
    conn_fd, lifeline = int(sys.argv[1]), int(sys.argv[2])
    threading.Thread(target=_exit_when_orphaned, args=(lifeline,), name="edgecap-lifeline",
                     daemon=True).start()
    conn = Connection(conn_fd)
    try:
        _serve(conn)
    except (EOFError, OSError):  # the parent closed the socket (or died), maybe mid-invoke
        pass


def _serve(conn: Connection) -> None:
    request: _OpenRequest = conn.recv()
    fd = _recv_fd(conn)
    try:
        buf = mmap.mmap(fd, request.size)
        inputs = _views(buf, request.inputs)
        outputs = _views(buf, request.outputs)
        runner = stages.open_stage(request.stage, request.spec, num_threads=request.num_threads,
                                   timing_only=request.timing_only, pace_ms=request.pace_ms)
    except BaseException as exc:  # the parent raises it as in-process, as one line
        conn.send(("error", _describe(exc)))
        return
    finally:
        os.close(fd)
    conn.send(("ready",))
    while True:
        seq, fault = conn.recv()
        try:
            if fault is not None:
                _perform(fault)
            out = runner(inputs)
            for name, view in outputs.items():
                np.copyto(view, out[name], casting="no")
        except BaseException as exc:  # the parent raises it
            reply: tuple = ("raised", seq, _describe(exc))
        else:
            reply = ("done", seq, runner.paced_ms)
        conn.send(reply)
