"""Typed file contracts: one way to read and check a JSON or TOML document.

Every file edgecap reads (bundle.json, plan.json, board profiles, calibration
files, dataset indexes, the service's config) is declared as ``msgspec.Struct``
types and read with ``decode``. msgspec checks types and ranges in its C
decoder, so a document is parsed and validated in one pass; on an ARM board it
imports in a few milliseconds and its wheel is a few hundred KB, where pydantic
pulls in pydantic-core (several MB) and costs tens of milliseconds to import.

Failures become one line that names the file, the field and the fix::

    plan/plan.json: field 'stages[1].predicted_ms' must be float <= 3600000.0; re-run `edgecap compile`

Ranges are part of the types below: NaN and infinity never pass a bounded
field, and sizes past any plausible bound are refused.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional, Tuple, Type, TypeVar, Union

import msgspec

try:  # Annotated is in typing from 3.9 on
    from typing import Annotated
except ImportError:  # pragma: no cover
    from typing_extensions import Annotated  # type: ignore[assignment]

from edgecap import files
from edgecap.errors import EdgecapError

T = TypeVar("T")

# Bounds: generous for any real model or board, small enough to refuse typos
# and hostile files (a 10^9-frame window, a stage predicted at 10^9 ms).
MAX_COUNT = 1_000_000  # frames per window, tokens, ops, features
MAX_DIM = 1 << 20  # one tensor dimension
MAX_BYTES = 1 << 40  # parameter or tensor bytes
MAX_MS = 3_600_000.0  # one hour per invoke
MAX_RATE = 1e18  # operations or bytes per second

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
Dim = Annotated[int, msgspec.Meta(ge=0, le=MAX_DIM)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)]
Millis = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_MS)]
Rate = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_RATE)]
Fps = Annotated[float, msgspec.Meta(ge=0.0, le=10_000.0)]
Finite = Annotated[float, msgspec.Meta(ge=-1e30, le=1e30)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FIELD = re.compile(r"^Object (missing required|contains unknown) field `(?P<name>[^`]*)`$")


def problem(exc: msgspec.MsgspecError) -> Tuple[str, str]:
    """Splits msgspec's message into the field's path and the problem, in edgecap's words.

    Returns:
      ``(path, problem)``, e.g. ``("stages[0].index", "must be int, got bool")``,
      ``("rnn.decoder_step", "is missing")``, ``("stages[0].x", "is unknown")``;
      the path is "" for the document itself.
    """
    m = _AT.match(str(exc).strip())
    msg, path = (m.group("msg"), (m.group("path") or "").lstrip(".")) if m else (str(exc), "")
    missing = _FIELD.match(msg)
    if missing:
        name = f"{path}.{missing.group('name')}" if path else missing.group("name")
        return name, "is missing" if missing.group(1) == "missing required" else "is unknown"
    if msg.startswith("Expected "):
        return path, "must be " + msg[len("Expected "):].replace("`", "")
    if msg[1:2].islower():  # "Invalid ..." reads on after a colon; "JSON ..." stays
        msg = msg[:1].lower() + msg[1:]
    return path, msg


def describe(exc: msgspec.MsgspecError) -> str:
    """Returns msgspec's message in edgecap's words: ``field 'a.b[0]' must be int, got str``."""
    path, what = problem(exc)
    if not path:
        return f"the document {what}" if what.startswith("must") else what
    return f"field '{path}' {what}" if what.startswith(("must", "is ")) else f"field '{path}': {what}"


def convert(
    obj: Any, type_: Type[T], *, where: str, fix: str, error: Type[EdgecapError] = EdgecapError
) -> T:
    """Checks already-parsed data (e.g. from TOML) against a schema type.

    Args:
      obj: Plain data (dicts, lists, numbers, strings).
      type_: The ``msgspec.Struct`` (or other msgspec type) to produce.
      where: What the data is, for messages (usually the file path).
      fix: What the user should do, appended to any message.
      error: The ``EdgecapError`` subclass to raise.

    Returns:
      The typed value.

    Raises:
      error: With one line ``where: field: problem; fix``.
    """
    try:
        return msgspec.convert(obj, type_, strict=True)
    except msgspec.ValidationError as exc:
        raise error(f"{where}: {describe(exc)}; {fix}") from None
    except UnicodeError:  # msgspec cannot encode a lone surrogate to check or quote it
        raise error(f"{where}: {NOT_UNICODE}; {fix}") from None
    except RecursionError:
        raise error(f"{where}: {TOO_DEEP}; {fix}") from None


def decode(
    data: Union[bytes, str], type_: Type[T], *, where: str, fix: str,
    error: Type[EdgecapError] = EdgecapError,
) -> T:
    """Parses and checks a JSON document against a schema type in one pass.

    Args:
      data: The JSON text.
      type_: The ``msgspec.Struct`` (or other msgspec type) to produce.
      where: What the document is, for messages (usually the file path).
      fix: What the user should do, appended to any message.
      error: The ``EdgecapError`` subclass to raise.

    Returns:
      The typed value.

    Raises:
      error: With one line ``where: field: problem; fix`` for malformed JSON,
        a wrong type, a missing or unknown field or a value out of range.
    """
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        raise error(f"{where}: {describe(exc)}; {fix}") from None
    except msgspec.DecodeError as exc:
        first = exc
    except RecursionError:  # msgspec's parser recurses once per nesting level
        raise error(f"{where}: not valid JSON ({TOO_DEEP}); {fix}") from None
    # Python's json module writes NaN and Infinity, which JSON has no words for;
    # read them so that the message names the field they are in.
    try:
        loose = json.loads(data)
    except (ValueError, RecursionError):
        raise error(f"{where}: not valid JSON ({describe(first)}); {fix}") from None
    try:
        problem = unrepresentable(loose)
    except RecursionError:
        raise error(f"{where}: not valid JSON ({TOO_DEEP}); {fix}") from None
    if problem != NOT_UNICODE:  # a lone surrogate has no field to name: msgspec cannot quote it
        convert(loose, type_, where=where, fix=fix, error=error)
    raise error(f"{where}: not valid JSON ({problem or describe(first)}); {fix}")


TOO_DEEP = "arrays or objects nested too deeply"
# A str holding a lone surrogate: JSON's "\ud800" as Python reads it, or a
# command-line byte that is not UTF-8 (os.fsdecode's surrogateescape).
NOT_UNICODE = "a string that is not valid Unicode, such as a lone surrogate \\ud800"


def unrepresentable(obj: Any) -> Optional[str]:
    """What Python's json module read that JSON has no words for: NaN, Infinity, a lone surrogate."""
    if isinstance(obj, float) and obj != obj or obj in (float("inf"), float("-inf")):
        return "NaN or Infinity where a number belongs"
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return NOT_UNICODE
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        found = unrepresentable(key) if isinstance(key, str) else None
        found = found or unrepresentable(value)
        if found:
            return found
    return None


def read_file(
    path: "str | os.PathLike[str]", type_: Type[T], *, fix: str,
    error: Type[EdgecapError] = EdgecapError, what: str = "file",
) -> T:
    """Reads a JSON file and checks it against a schema type.

    Args:
      path: The file.
      type_: The schema type.
      fix: What the user should do about a malformed file.
      error: The ``EdgecapError`` subclass to raise.
      what: What the file is, for messages.

    Returns:
      The typed value.

    Raises:
      error: If the file is missing, not a regular file, too large (``edgecap.files``),
        unreadable (named as such) or malformed.
    """
    data = files.read_bytes(path, what=what, fix=fix, error=error)
    return decode(data, type_, where=str(path), fix=fix, error=error)


def encode(value: Any) -> bytes:
    """Returns ``value`` (Structs, dataclasses, plain data) as indented JSON with a final newline."""
    return msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n"

