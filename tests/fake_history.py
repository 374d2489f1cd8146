"""A small in-memory ``History`` (the read side of edgecap.service.history) for the page's tests.

It keeps the contract the HTTP routes rely on: ``search`` takes words and
"quoted phrases" (every one must appear in the text, any case), a camera,
a time range and a limit, answers newest first with thumbnails not loaded;
``thumbnail`` returns the bytes or None. It records every search it answers.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Iterable, List, Optional

from edgecap.events import Event

_TERM = re.compile(r'"([^"]*)"|(\S+)')


class FakeHistory:
    """Events held in a list.

    Args:
      events: The events to answer from (with their thumbnails).
    """

    def __init__(self, events: Iterable[Event]) -> None:
        self.events = list(events)
        self.searches: List[Dict[str, Any]] = []

    def search(self, q: str = "", camera: str = "", since: Optional[float] = None,
               until: Optional[float] = None, limit: int = 50) -> List[Event]:
        """Events whose text holds every word and phrase of ``q``, newest first, without thumbnails."""
        self.searches.append({"q": q, "camera": camera, "since": since, "until": until, "limit": limit})
        terms = [(phrase or word).lower() for phrase, word in _TERM.findall(q) if (phrase or word).strip()]
        found = [e for e in self.events
                 if all(t in e.text.lower() for t in terms)
                 and (not camera or e.camera == camera)
                 and (since is None or e.end_time >= since)
                 and (until is None or e.start_time <= until)]
        found.sort(key=lambda e: e.start_time, reverse=True)
        return [dataclasses.replace(e, thumbnail=b"", thumbnail_stored=bool(e.thumbnail)) for e in found[:limit]]

    def thumbnail(self, event_id: str) -> Optional[bytes]:
        """The event's JPEG, or None for an unknown id or an event without one."""
        for e in self.events:
            if e.id == event_id:
                return e.thumbnail or None
        return None


def event(camera: str, text: str, start: float, seconds: float = 10.0, thumbnail: bytes = b"",
          confidence: float = -0.2, closed: bool = True) -> Event:
    """An event of ``camera`` from ``start`` (Unix seconds) lasting ``seconds``, id as the service makes it."""
    return Event(id=f"{camera}@{round(start * 1000)}", camera=camera, text=text, start_time=start,
                 end_time=start + seconds, confidence=confidence, windows=max(1, round(seconds * 8 / 16)),
                 thumbnail=thumbnail, closed=closed)
