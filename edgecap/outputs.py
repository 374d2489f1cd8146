"""Output paths: checked before a run starts, and written whole or not at all.

A command checks every path it will write (``check_output``) before it does
any work, so a typo in ``--json`` costs one line instead of the run's results.
The directory an output goes in must already exist: edgecap creates no missing
trees for a file (a mistyped parent would otherwise silently grow one); the
one thing it creates is an output *folder* itself (``compile -o OUT_DIR``).
Files are written to a temporary file beside the target and renamed onto it
(``atomic_path``), so a run that fails or is interrupted leaves either the old
file or none, never half of one. A target that exists and is not a regular
file (``/dev/null``, a FIFO) is written in place, and a symbolic link is
written through (the file it points to is replaced; the link stays).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Union

from edgecap.errors import ConfigError

PathLike = Union[str, "os.PathLike[str]"]


def _nearest_existing(path: Path) -> Path:
    """The path itself or its closest ancestor that exists (``.`` at worst)."""
    for p in (path, *path.parents):
        if os.path.lexists(p):
            return p
    return Path(".")


def _probe(directory: Path, what: str, target: Path) -> None:
    # Permission bits do not tell (root ignores them; a read-only mount does not show
    # in them): creating the temporary file the write itself will create does.
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".edgecap-", suffix=".probe")
    except OSError as e:
        raise ConfigError(f"{what} {target}: cannot write in {directory} ({e.strerror}): "
                          "choose a directory you can write") from None
    os.close(fd)
    os.unlink(name)


def check_output(path: PathLike, what: str, directory: bool = False) -> Path:
    """Checks that an output can be written, before any work is done.

    Args:
      path: Where the command will write.
      what: The option that named it, for the message, e.g. ``--json``.
      directory: The output is a folder the command fills (created if missing,
        but not its parent), not a file.

    Returns:
      ``path`` as a ``Path``.

    Raises:
      ConfigError: If the path is a directory where a file belongs (or a file
        where a folder belongs), its directory is missing or is a file, or
        nothing can be created there (read-only, permission denied).
    """
    target = Path(path)
    real = Path(os.path.realpath(target))  # a link is written through, in its target's directory
    try:
        if target.is_dir():
            if not directory:
                raise ConfigError(f"{what} {target}: is a directory: give the path of a file "
                                  "(in it or elsewhere)")
            _probe(target, what, target)
            return target
        if os.path.lexists(target):
            if directory:
                raise ConfigError(f"{what} {target}: is a file, not a folder: pass a folder "
                                  "(a new name is created)")
            if not target.is_file():  # /dev/null, a FIFO: written in place
                if not os.access(target, os.W_OK):
                    raise ConfigError(f"{what} {target}: not writable: choose another path")
                return target
        parent = real.parent
        if not parent.is_dir():
            found = _nearest_existing(parent)
            if found.is_dir():
                raise ConfigError(f"{what} {target}: no directory {parent}: create it first "
                                  f"(mkdir -p {parent}) or choose another path")
            raise ConfigError(f"{what} {target}: {found} is a file, not a directory: "
                              "choose a path in a directory")
    except OSError as e:  # e.g. a parent this user may not search
        raise ConfigError(f"{what} {target}: cannot be checked ({e.strerror}): "
                          "choose a path you can write") from None
    _probe(parent, what, target)
    return target


def _file_mode(existing: Path) -> int:
    """Permission bits a new file gets: those of the file it replaces, else 0666 less the umask."""
    try:
        return existing.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yields a temporary path beside ``path`` and renames it onto ``path`` if the block succeeds.

    If the block raises, the temporary file is removed and ``path`` is left as
    it was. A ``path`` that exists and is not a regular file (``/dev/null``) is
    yielded as it is.

    Raises:
      ConfigError: If the temporary file cannot be created or renamed.
    """
    if os.path.lexists(path) and not Path(path).is_file():
        yield Path(path)
        return
    # A symbolic link stays one: the file it points to is the one replaced.
    target = Path(os.path.realpath(path))
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise ConfigError(f"{target}: cannot write ({e.strerror}): choose a directory you "
                          "can write") from None
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, _file_mode(target))
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path: PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` whole or not at all (see ``atomic_path``).

    Raises:
      ConfigError: If it cannot be written (e.g. the disk is full).
    """
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot write ({e.strerror}); nothing was written") from None


def write_state(path: PathLike, text: str, mode: int = 0o600) -> None:
    """Writes one of edgecap's own state files whole or not at all, ``mode`` whatever the umask.

    Unlike an output the user names (``write_text``), a state file (learned
    corrections) is edgecap's alone: a symbolic link or anything but a plain
    file in its place is not followed nor replaced.

    Raises:
      ConfigError: If ``path`` is a symbolic link or not a regular file, or
        cannot be written (e.g. the disk is full); nothing was written.
    """
    target = Path(path)
    if os.path.islink(target) or (os.path.lexists(target) and not target.is_file()):
        what = "a symbolic link" if os.path.islink(target) else "not a regular file"
        raise ConfigError(f"{target}: is {what}; edgecap writes its state only to a plain file of its own: "
                          "remove it, and edgecap writes a new one")
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise ConfigError(f"{target}: cannot write ({e.strerror}): choose a directory you can write") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
        os.replace(name, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise ConfigError(f"{target}: cannot write ({e.strerror}); nothing was written") from None

