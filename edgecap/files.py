"""Reading the files edgecap is given: regular files only, never blocking, never unbounded.

Every file the product reads by a name a user can choose (bundle.json, its
models and vocabulary, plan.json and its segments, the service's TOML and
token file, board profiles, calibration files, dataset indexes, traces) is
read here. A FIFO would block ``open`` forever and ``/dev/zero`` would fill
memory, so a file is opened with ``O_NONBLOCK`` (opening a FIFO cannot wait
for a writer), refused unless ``fstat`` says it is a regular file, and read
up to a bound for its kind (``LIMITS``); one byte more is refused, so a file
that grows while read is refused too.

The bounds are generous for any real file of the kind and small enough that
a wrong file costs a line rather than the board's memory:

============  ========  =================================================
kind          bound     files
============  ========  =================================================
``json``      64 MiB    bundle.json, plan.json, board profiles, calibration
                        and published-figure files, dataset indexes
``toml``      1 MiB     the service's config file
``token``     64 KiB    the service's access token file
``text``      16 MiB    a bundle's vocabulary
``model``     512 MiB   .tflite models and plan segments (an EdgeTPU holds
                        8 MB; the largest Coral zoo model is under 100 MB)
``trace``     1 GiB     a Chrome trace written by ``--trace`` (read to plot)
============  ========  =================================================
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional, Tuple, Type

from edgecap.errors import EdgecapError

MiB = 1 << 20
LIMITS = {
    "json": 64 * MiB,
    "toml": 1 * MiB,
    "token": 64 * 1024,
    "text": 16 * MiB,
    "model": 512 * MiB,
    "trace": 1024 * MiB,
}

# Opening a FIFO must not wait for a writer; nor may a file become our terminal.
_OPEN_FLAGS = os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(OSError):
    """A FIFO, device or socket where a regular file belongs."""


class FileTooLarge(OSError):
    """A file larger than its kind's bound."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check(path: Path, st: os.stat_result, limit: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file", str(path))
    if st.st_size > limit:
        raise FileTooLarge(errno.EFBIG, f"{st.st_size} bytes, more than the {_size(limit)} allowed",
                           str(path))


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"


def read_regular(path: "str | os.PathLike[str]", kind: str) -> Tuple[bytes, os.stat_result]:
    """Reads a regular file whole, without blocking on a special file and within its kind's bound.

    Args:
      path: The file (a symbolic link is followed).
      kind: A key of ``LIMITS``: how large the file may be.

    Returns:
      ``(data, stat)``: the bytes, and the ``fstat`` of the file they came from.

    Raises:
      NotRegularFile: For a FIFO, device or socket (nothing is read from it).
      FileTooLarge: For a file over the bound.
      IsADirectoryError, FileNotFoundError, PermissionError, OSError: As ``open`` raises them.
      ValueError: For a name with a NUL byte.
    """
    path = Path(path)
    limit = LIMITS[kind]
    # stat first so that a device is never opened (opening one can have effects);
    # fstat again after opening, in case the name changed in between.
    _check(path, os.stat(path), limit)
    fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    with open(fd, "rb", buffering=0) as f:  # owns fd from here
        st = os.fstat(fd)
        _check(path, st, limit)
        # One read takes a regular file whole; more only if it grew since fstat
        # (in chunks: FileIO.read(n) allocates n bytes before it reads).
        data = f.read(st.st_size + 1)
        while len(data) <= limit:
            more = f.read(min(limit + 1 - len(data), MiB))
            if not more:
                break
            data += more
    if len(data) > limit:
        raise FileTooLarge(errno.EFBIG, f"more than the {_size(limit)} allowed", str(path))
    return data, st


def read_bytes(
    path: "str | os.PathLike[str]", *, what: str, fix: str, kind: str = "json",
    error: Type[EdgecapError] = EdgecapError, missing_fix: Optional[str] = None,
) -> bytes:
    """Reads a file the product was given, turning every failure into one line.

    Args:
      path: The file.
      what: What the file is ("plan", "board profile", ...), for messages.
      fix: What the user should do about an unreadable file.
      kind: A key of ``LIMITS``: how large the file may be.
      error: The ``EdgecapError`` subclass to raise.
      missing_fix: What to do when it does not exist (default: ``fix``).

    Returns:
      The file's bytes.

    Raises:
      error: If the file is missing, a directory, a FIFO, device or socket,
        over its kind's bound, or unreadable (permission denied is named as such).
    """
    path = Path(path)
    try:
        return read_regular(path, kind)[0]
    except FileNotFoundError:
        raise error(f"{path}: no such {what}; {missing_fix or fix}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}; {fix}") from None
    except PermissionError:
        raise error(f"{path}: permission denied; make the {what} readable by this user") from None
    except NotRegularFile as exc:
        raise error(f"{path}: {exc.strerror}: give the {what} as a regular file; {fix}") from None
    except FileTooLarge as exc:
        raise error(f"{path}: too large for a {what} ({exc.strerror}); {fix}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc}); {fix}") from None
    except ValueError:  # a NUL in the name, which no system call takes
        raise error(f"{str(path)!r}: not a usable file name (it contains a NUL byte); {fix}") from None
