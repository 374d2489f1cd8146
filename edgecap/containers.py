"""Whether a video file's container is whole: cut-off AVI and MP4 files, found from their headers.

A recording that stopped before it was finished (power lost, a full disk, a
killed recorder) leaves a file the decoder reads happily up to where it ends:
OpenCV reports no error, and an AVI written to a pipe even claims 2**30 frames.
The container's own structure says it: every RIFF chunk and ISO-BMFF box
declares its size, so one that runs past the end of the file was cut off, an
AVI without its ``idx1`` index (or an OpenDML ``indx``) was never closed, and
an MP4 without a ``moov`` box has no index at all. Only chunk headers are
read: a seek and 8 bytes a chunk.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

# A RIFF size field of all ones (or zero) means "unknown": written to a pipe.
_UNKNOWN = (0, 0xFFFFFFFF)


@dataclass(frozen=True)
class Damage:
    """What is wrong with a container.

    Attributes:
      what: A phrase for one line, e.g. ``cut off at byte 42000 inside a 00dc
        chunk of 1073 bytes, after 31 whole frame chunks``.
      cut: True when data is missing (a chunk or box runs past the end); False
        when only the index is (every frame it has is whole, but a recording
        cut off between two frames cannot be told from a finished one).
    """

    what: str
    cut: bool


def damage(path: Path) -> Optional[Damage]:
    """Says what is wrong with a video file's container, or None when it is whole (or not AVI/MP4).

    Args:
      path: The video file.

    Returns:
      The ``Damage``, or None for a whole file or another container.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) == 12 and head[:4] == b"RIFF" and head[8:12] == b"AVI ":
                return _riff(f, size)
            if len(head) >= 8 and head[4:8] == b"ftyp":
                return _isobmff(f, size)
    except OSError:
        return None  # the reader reports unreadable files itself
    return None


def _riff(f: BinaryIO, size: int) -> Optional[Damage]:
    # Top level: one RIFF 'AVI ' chunk, then OpenDML 'AVIX' extensions past 1 GiB.
    walk = _Walk(f, size)
    pos = 0
    while pos + 8 <= size and walk.problem is None:
        f.seek(pos)
        tag, length = struct.unpack("<4sI", f.read(8))
        if tag != b"RIFF":
            return Damage(f"has no RIFF chunk header at byte {pos} (the data there is damaged)",
                          cut=True)
        end = size if length in _UNKNOWN else pos + 8 + length
        if end > size:
            return Damage(f"cut off at byte {size}: its RIFF chunk runs to byte {end}", cut=True)
        walk.chunks(pos + 12, end)
        pos = end + (end & 1)
    if walk.problem is not None:
        return Damage(walk.problem, cut=True)
    if not walk.indexed:
        return Damage("has no index (idx1 or indx), as a recording that did not finish or was "
                      "written to a pipe", cut=False)
    return None


class _Walk:
    """Walks RIFF chunks, descending into lists, noting an index and the first chunk cut off."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size
        self.indexed = False
        self.problem: Optional[str] = None
        self.frames = 0

    def chunks(self, pos: int, end: int) -> None:
        while pos + 8 <= end and self.problem is None:
            self.f.seek(pos)
            tag, length = struct.unpack("<4sI", self.f.read(8))
            if not _printable(tag):
                self.problem = f"has no chunk header at byte {pos} (the data there is damaged)"
                return
            name = tag.decode("ascii")
            unknown = tag == b"LIST" and length in _UNKNOWN
            # A list of unknown size (written to a pipe) runs to the end of the file.
            chunk_end = self.size if unknown else pos + 8 + length
            if chunk_end > self.size:
                self.problem = (f"cut off at byte {self.size} inside a {name} chunk of {length} "
                                f"bytes, after {self.frames} whole frame chunks")
                return
            if tag in (b"idx1", b"indx"):
                self.indexed = True
            elif tag == b"LIST":
                kind = self.f.read(4)
                # The frames of a list whose size is known are whole: only the headers
                # ('hdrl' holds an OpenDML 'indx') and a piped list of unknown size are walked.
                if unknown or kind in (b"hdrl", b"strl", b"odml"):
                    self.chunks(pos + 12, chunk_end)
            elif name[:2].isdigit():  # a stream's data chunk: '00dc', '01wb'
                self.frames += 1
            pos = chunk_end + (chunk_end & 1)
        if pos < end == self.size and self.problem is None:
            self.problem = f"cut off at byte {self.size} inside a chunk header"


def _printable(tag: bytes) -> bool:
    return all(32 <= b < 127 for b in tag)


def _isobmff(f: BinaryIO, size: int) -> Optional[Damage]:
    pos, seen = 0, set()
    while pos + 8 <= size:
        f.seek(pos)
        length, kind = struct.unpack(">I4s", f.read(8))
        header = 8
        if length == 1:  # a 64-bit size follows the type
            length, = struct.unpack(">Q", f.read(8))
            header = 16
        elif length == 0:  # the box runs to the end of the file
            length = size - pos
        if not _printable(kind):
            return Damage(f"has no box header at byte {pos} (the data there is damaged)", cut=True)
        name = kind.decode("ascii")
        if length < header:
            return Damage(f"has a {name!r} box of impossible size {length} at byte {pos}", cut=True)
        if pos + length > size:
            return Damage(f"cut off at byte {size} inside its {name} box, which runs to byte "
                          f"{pos + length}", cut=True)
        seen.add(kind)
        pos += length
    if b"moov" not in seen:
        return Damage("has no moov box (its index): its recording did not finish", cut=True)
    return None
