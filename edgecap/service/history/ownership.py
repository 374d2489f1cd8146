"""Whether a history path is edgecap's to write, and the lock that keeps it one service's.

edgecap writes, renames or deletes only its own files. A ``[history] path``
must name nothing yet, an empty regular file, or a regular SQLite file that is
edgecap's history: one that carries edgecap's application id in its header
(``PRAGMA application_id``, set on every history it opens), or, for a history
written before the id existed, one whose tables are the history's and that no
other application claims. Anything else — a device, a FIFO, a directory, a
symbolic link, another program's database, a text file, the config — is
refused in one line and left as it is, and so are its ``-wal``, ``-shm`` and
``-journal`` companions when they are not plain files.

A lock file beside the history (``PATH.lock``, ``flock``) keeps two services
from writing one history: the second is refused in one line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import stat
from pathlib import Path
from typing import Optional, Set

from edgecap.errors import ConfigError

APPLICATION_ID = 0x45434150  # "ECAP" in the SQLite header (offset 68)
_MAGIC = b"SQLite format 3\x00"
# A history written before the application id: these tables, no one else's id.
_HISTORY_TABLES = {"events", "events_fts", "thumbnails"}
_COMPANIONS = ("-wal", "-shm", "-journal")
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
FIX = ("edgecap takes only its own files: give [history] path a file of its own (one that does not exist "
       "yet), or move that one away")


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def why_not_ours(path: Path) -> Optional[str]:
    """Says why ``path`` is not edgecap's history to write, or None when it is (or names nothing yet).

    Reads no more than the file's 100-byte header and, for a history older
    than the application id, its list of tables (read-only, changing nothing).

    Args:
      path: The history's path.

    Returns:
      None, or the reason as words that follow the path, e.g. "is a FIFO (named pipe)".
    """
    for suffix in _COMPANIONS:
        companion = Path(str(path) + suffix)
        try:
            st = os.lstat(companion)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not stat.S_ISREG(st.st_mode):
            return f"has a companion {companion.name} that is {_kind(st.st_mode)}"
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet (its directory is made, or refused, later)
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}"
    if st.st_size == 0:
        return None  # nothing in it to lose: a history starts there
    header = _header(path)
    if not header.startswith(_MAGIC):
        return "is not an SQLite database (it has no SQLite header)"
    application = int.from_bytes(header[68:72], "big")
    if application == APPLICATION_ID:
        return None
    if application:
        return f"is another application's SQLite database (application id {application:#x})"
    tables = _tables(path)
    if tables is None:
        return "is an SQLite database whose tables cannot be read (not edgecap's, or damaged beyond telling)"
    if _HISTORY_TABLES <= tables:
        return None
    shown = ", ".join(sorted(tables)[:4]) + (", ..." if len(tables) > 4 else "")
    return f"is another program's SQLite database (tables: {shown or 'none'})"


def _header(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


def _tables(path: Path) -> Optional[Set[str]]:
    """The tables of an SQLite file, read as immutable (no lock, no -wal or -shm touched); None if unreadable."""
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?immutable=1", uri=True)
        try:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.Error:
        return None


def check(path: Path) -> None:
    """Refuses a history path that is not edgecap's (``why_not_ours``).

    Raises:
      ConfigError: One line naming the path, what it is and the fix.
    """
    try:
        reason = why_not_ours(path)
    except OSError as exc:
        raise ConfigError(f"history: cannot read {path} ({exc.strerror or exc}); {FIX}") from None
    if reason is not None:
        raise ConfigError(f"history: {path} {reason}; {FIX}")


def create(path: Path) -> None:
    """Creates an empty history file, mode 0600 whatever the umask; nothing if it exists.

    Raises:
      OSError: If it cannot be created (a read-only or full file system, permissions).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)  # SQLite gives its -wal and -shm the mode of the database file
    finally:
        os.close(fd)


class Lock:
    """``PATH.lock``, held (``flock``) by the one service that writes the history at ``PATH``.

    Args:
      path: The history's path.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(str(path) + ".lock")
        self._history = path
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        """Whether this process holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the lock (creating the file, 0600); nothing if already held.

        Raises:
          ConfigError: Another process holds it, or the lock file is not a plain file.
          OSError: The lock file cannot be created (a read-only or full file system).
        """
        if self._fd is not None:
            return
        with_link = os.path.lexists(self.path) and not stat.S_ISREG(os.lstat(self.path).st_mode)
        if with_link:
            raise ConfigError(f"history: {self.path} is {_kind(os.lstat(self.path).st_mode)}; {FIX}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise ConfigError(f"history: {self._history} is in use by another edgecap serve"
                              f"{f' (pid {holder})' if holder.isdigit() else ''}; give each service its "
                              "own [history] path") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Lets the lock go (the file stays: removing it would race the next service to take it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
