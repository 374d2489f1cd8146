"""A model's first allocate and invoke, in a child process, before this process opens it.

The verifier (``edgecap.tflite_verify``, ``edgecap.operator_rules``) refuses
what it can name; a kernel may still crash on a file it accepts, and a
segfault cannot be caught. So, as the libedgetpu probe does for the delegate
(``edgecap.edgetpu_runtime``), a model this process has not seen before is
first opened, allocated and invoked once (zeros in) in a child process: a
child killed by a signal, or hung, becomes one ``EdgecapError`` line naming the
model and the signal, and the model never reaches this process's interpreter.

Paid once per file content: a model that passed is remembered by its SHA-256
for the process and on disk (``$XDG_CACHE_HOME/edgecap/invoked/``, default
``~/.cache``), so the demo bundle's models are checked once per machine.

The children come from one checker process per edgecap process, started at
the first check (a fresh interpreter that imports numpy and TFLite once, as
``edgecap.isolation``'s workers) and ended when this process ends or calls
``close()``: for each model it forks a child that has created no interpreter
yet, so no TFLite thread is forked. A child whose interpreter raises (an
unresolved custom op: an EdgeTPU-compiled model on a CPU-only host) did not
crash: that error is left for the caller's own open to report.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Set, Type

from edgecap.errors import BundleError, EdgecapError

# A first invoke of an edge model takes milliseconds to a few seconds; a child
# past this is hung (an endless kernel loop on a hostile shape).
TIMEOUT_S = 120.0
_CHILD = "from edgecap.trial_invoke import _checker_main; _checker_main()"


@dataclass(frozen=True)
class Outcome:
    """What a child's first invoke of a model did.

    Attributes:
      kind: ``ok``, ``error`` (the interpreter raised), ``crash`` (killed by a
        signal) or ``hung`` (killed after ``TIMEOUT_S``).
      detail: The error's first line, or the signal's name ('' when ok).
    """

    kind: str
    detail: str = ""


def cache_dir() -> Path:
    """Where passed models' hashes are kept: ``$XDG_CACHE_HOME/edgecap/invoked`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgecap" / "invoked"


class _Checker:
    """The checker process: one request line in (a model path), one result line out."""

    def __init__(self) -> None:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        # The child imports edgecap from where this process did, installed or not.
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True, text=True, bufsize=1)

    def run(self, path: str) -> Optional[Outcome]:
        """Returns the child's outcome, or None if the checker itself is gone."""
        try:
            self.proc.stdin.write(json.dumps({"path": path, "timeout_s": TIMEOUT_S}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (OSError, ValueError):
            return None
        if not line:
            return None
        answer = json.loads(line)
        return Outcome(answer["kind"], answer["detail"])

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the checker's loop ends at end of input
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_checker: Optional[_Checker] = None
_passed: Set[str] = set()


def close() -> None:
    """Ends the checker process, if one was started (the next check starts another)."""
    global _checker
    with _lock:
        if _checker is not None:
            _checker.close()
            _checker = None


atexit.register(close)


def trial(path: "str | os.PathLike[str]") -> Outcome:
    """Opens, allocates and invokes a model once in a child process (no cache).

    Args:
      path: The .tflite file (verified already: this is for what the verifier cannot see).

    Returns:
      What the child's first invoke did.
    """
    global _checker
    with _lock:
        for _ in range(2):  # a checker that died (killed from outside) is started again once
            if _checker is None:
                _checker = _Checker()
            outcome = _checker.run(os.fspath(Path(path).resolve()))
            if outcome is not None:
                return outcome
            _checker.close()
            _checker = None
    return Outcome("error", "the model checker process did not answer")


def check(data: bytes, path: "str | os.PathLike[str]", *, error: Type[EdgecapError] = BundleError,
          fix: str = "re-export it") -> Outcome:
    """Refuses a model whose first invoke crashes or hangs a child process; cached by content.

    Args:
      data: The file's bytes, as read (hashed for the cache).
      path: The file (the child opens it; named in the message).
      error: The error class to raise.
      fix: What the user should do, ending the message.

    Returns:
      The outcome (``ok`` also when the hash was cached; ``error`` is left to the caller).

    Raises:
      EdgecapError: ``error``, one line naming the model and the signal.
    """
    digest = hashlib.sha256(data).hexdigest()
    stamp = cache_dir() / digest
    if digest in _passed or stamp.is_file():
        _passed.add(digest)
        return Outcome("ok")
    outcome = trial(path)
    if outcome.kind == "crash":
        raise error(f"{path}: the model crashed the TFLite interpreter on its first invoke in a child "
                    f"process ({outcome.detail}), so it was not opened here; {fix}")
    if outcome.kind == "hung":
        raise error(f"{path}: the model's first invoke in a child process did not finish within "
                    f"{TIMEOUT_S:.0f} s ({outcome.detail}); {fix}")
    if outcome.kind == "ok":
        _passed.add(digest)
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        except OSError:  # a read-only cache only costs the check again next time
            pass
    return outcome


# -- the checker process --------------------------------------------------------------------


def _first_invoke(path: str) -> None:
    """In the forked child: what the parent's open will do, then one invoke on zeros."""
    import numpy as np

    from edgecap.interpreter import make_cpu_interpreter

    interp = make_cpu_interpreter(path)
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.zeros(d["shape"], dtype=d["dtype"]))
    interp.invoke()


def _one(path: str, timeout_s: float) -> Outcome:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into the loop
        os.close(read_end)
        # Native chatter on stdout would be read as the checker's answer.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        code = 0
        try:
            _first_invoke(path)
        except BaseException as exc:  # noqa: BLE001 - any Python error is the interpreter refusing it
            text = str(exc).strip().splitlines()
            os.write(write_end, f"{type(exc).__name__}: {text[0] if text else ''}"[:500].encode())
            code = 3
        os._exit(code)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], timeout_s)
    hung = not ready
    if hung:
        os.kill(pid, signal.SIGKILL)
    message = b""
    if not hung:
        while True:  # the pipe ends when the child exits
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            message += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if hung:
        return Outcome("hung", f"killed after {timeout_s:.0f} s")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return Outcome("crash", f"killed by {name}")
    if os.WEXITSTATUS(status) != 0:
        return Outcome("error", message.decode("utf-8", "replace") or f"exit status {os.WEXITSTATUS(status)}")
    return Outcome("ok")


def _checker_main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    # Imported once here, so that each forked child only opens its model.
    import numpy  # noqa: F401

    from edgecap import interpreter  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        outcome = _one(request["path"], float(request["timeout_s"]))
        sys.stdout.write(json.dumps({"kind": outcome.kind, "detail": outcome.detail}) + "\n")
        sys.stdout.flush()
