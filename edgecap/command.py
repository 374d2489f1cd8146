"""The exit policy every edgecap command shares: one line and 2 on bad input, one line and 1 on a
failure at run time, 130 on Ctrl-C, 143 on SIGTERM.

``run_command`` wraps a command's body: the ``edgecap`` command line
(``edgecap.cli``) and the scripts beside it (``tools/``, the compiler's
benchmark and validity table, ``models/paper_bundles.py``) all exit the same
way. It belongs to commands only: nothing in the runtime library imports it.
SIGINT and SIGTERM unwind the body like an exception, so the run in progress
is closed on the way out (context managers); the exit codes are 128 + the
signal number, what a shell reports for a process the signal killed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Iterator

from edgecap.errors import EdgecapError, RunFailure

EXIT_RUN_FAILURE = 1
# Set (to anything but empty), a failure at run time prints its traceback too.
DEBUG_ENV = "EDGECAP_DEBUG"
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

_log = logging.getLogger("edgecap")


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM, so that it unwinds like Ctrl-C."""


def _stop(signum: int, frame: Any) -> None:
    # The first signal starts the stop; later ones are ignored until the process
    # ends, so that none interrupts the closing of workers half-way (a traceback,
    # a worker or a file left behind). SIG_IGN, not a Python handler: Python
    # resets its own handlers to the default at exit, which a signal then kills.
    for other in (signal.SIGINT, signal.SIGTERM):
        signal.signal(other, signal.SIG_IGN)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def _signals_stop_once() -> Iterator[None]:
    # Only the main thread may set handlers (a command may be run from others).
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is _stop:  # no signal came: put back the caller's handlers
            for s, handler in previous.items():
                signal.signal(s, handler)


# A write the disk (or the device, /dev/full) has no room for.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def run_command(prog: str, body: Callable[[], int], sigterm_exit: int = EXIT_SIGTERM) -> int:
    """Runs a command's body with ``edgecap``'s exit policy.

    Bad input is one line, ``PROG: error: ...``, and exit code 2, and so is
    an output the disk has no room for (stdout included); a failure at run
    time (``RunFailure``, e.g. a CPU stage that raised) is one line too and
    exit code 1, its traceback logged at debug level (the ``edgecap``
    logger) and printed with ``$EDGECAP_DEBUG`` set; SIGINT (Ctrl-C) and
    SIGTERM unwind the body (its ``with`` blocks close pipelines and discard
    half-written outputs) and exit 130 and 143, without a traceback. Once
    one has come, SIGINT and SIGTERM are ignored for the rest of the
    process's life: a second Ctrl-C cannot cut the closing short.

    Args:
      prog: The command's name, for the error line (e.g. ``edgecap caption``).
      body: Does the work; returns the exit code.
      sigterm_exit: The exit code of a SIGTERM that unwinds the body: 0 for a
        service, whose normal end is a stop (``edgecap serve``).

    Returns:
      The exit code.
    """
    try:
        with _signals_stop_once():
            code = body()
            if sys.stdout is not None:  # None when the command runs with stdout closed (`>&-`)
                sys.stdout.flush()  # a full disk under stdout shows here, not in a traceback at exit
            return code
    except EdgecapError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except RunFailure as e:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        else:
            _log.debug("%s: %s", prog, e, exc_info=True)
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_RUN_FAILURE
    except Terminated:
        return sigterm_exit
    except KeyboardInterrupt:
        return EXIT_SIGINT
    except BrokenPipeError:  # e.g. `edgecap caption clip.mp4 | head -1`
        sys.stderr.close()
        return 0
    except OSError as e:
        if e.errno not in _NO_ROOM:
            raise
        # A failed flush drops what stdout buffered, so nothing fails again at exit.
        print(f"{prog}: error: cannot write {e.filename or 'the output'} ({e.strerror}): free space "
              "on the disk it goes to, or send it elsewhere", file=sys.stderr)
        return 2
