"""What a user types into a history search: words and phrases, and times.

``fts_query`` turns words and ``"quoted phrases"`` into an FTS5 query that
cannot be a syntax error; ``parse_time`` reads ISO-8601 or how long ago
(``30m``, ``2d``); ``iso_seconds`` reads ISO-8601 alone (the HTTP API's
``since`` and ``until`` take Unix seconds besides).
"""

from __future__ import annotations

import datetime
import re
import time
from typing import Optional

MAX_TERMS = 16  # words and phrases of a query that count
_DAY_S = 86_400.0


def fts_query(text: str) -> str:
    """Turns what a user typed into an FTS5 query that cannot be a syntax error.

    Words and ``"quoted phrases"`` must all match (AND) in the event's text;
    terms beyond ``MAX_TERMS`` are ignored. There are no prefix queries: over
    a large history FTS5 answers one in tens of milliseconds, a word in one. Everything but letters and digits is a
    separator, as for the index's tokenizer, so FTS5's operators and quotes
    in the text are plain words or nothing.

    Args:
      text: The user's query.

    Returns:
      The FTS5 query, or "" when the text holds no word.
    """
    terms = []
    for phrase, word in re.findall(r'"([^"]*)"?|(\S+)', text):
        words = re.findall(r"\w+", phrase if phrase else word, flags=re.UNICODE)
        words = [w.replace("_", " ") for w in words]  # "_" separates for unicode61 too
        if not words or not "".join(words).strip():
            continue
        terms.append('text : "' + " ".join(words) + '"')  # the text only: a camera's name is no match
    return " AND ".join(terms[:MAX_TERMS])


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": _DAY_S, "w": 7 * _DAY_S}


def iso_seconds(text: str) -> float:
    """Reads an ISO-8601 time (local unless it ends in ``Z`` or an offset) as Unix seconds.

    Raises:
      ValueError: Not ISO-8601, or a time the platform cannot convert.
    """
    text = text.strip()
    try:
        # Python before 3.11 does not read "Z"; it is UTC.
        when = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        return when.timestamp()  # a naive time is local, as timestamp() takes it
    except (OverflowError, OSError) as exc:
        raise ValueError(str(exc)) from None


def parse_time(text: str, now: Optional[float] = None) -> float:
    """Reads a time a user gives: ISO-8601, or how long ago (``90s``, ``15m``, ``1h``, ``2d``, ``1w``).

    Args:
      text: ``2026-12-01T08:00``, ``2026-12-01 08:00:00+01:00``, ``2026-12-01``
        (local time unless it has an offset or ``Z``), or a number and a unit.
      now: The Unix time relative forms count back from (default: now).

    Returns:
      Unix seconds.

    Raises:
      ValueError: With the fix, if the text is neither.
    """
    text = text.strip()
    relative = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text)
    if relative:
        return (time.time() if now is None else now) - float(relative.group(1)) * _UNITS[relative.group(2)]
    try:
        return iso_seconds(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give ISO-8601 (2026-12-01T08:00, local time unless it "
                         "ends in Z or an offset) or how long ago (30m, 1h, 2d)") from None
