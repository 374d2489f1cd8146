"""Events: runs of consecutive windows of one camera that say the same thing.

A caption stream says the same sentence again and again while nothing
changes; an event is what a person wants instead: what was seen, from when to
when, how sure the model was, and a thumbnail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal

# What happened to an event at a call of ``Sink.event``: it opened (its first
# window), took one more window, or closed (the caption changed or the camera
# went offline or the run ended).
Change = Literal["opened", "extended", "closed"]


@dataclass
class Event:
    """A run of consecutive windows of one camera with the same (or near-same) caption.

    Attributes:
      id: Unique across cameras and restarts: ``CAMERA@START_MS``.
      camera: The camera's name (``None``'s events from the API use ``""``).
      text: The caption that stands for the event (its most confident window's).
      start_time: Seconds of the first window's first frame: Unix time in
        the service, source timestamps from ``EdgeCaptioner.events``.
      end_time: Seconds of the last window's last frame, same clock.
      confidence: The best confidence of its windows (``Caption.confidence``).
      windows: How many windows it merged.
      thumbnail: A small JPEG of a representative frame (b"" when none).
      closed: True once it ended.
    """

    id: str
    camera: str
    text: str
    start_time: float
    end_time: float
    confidence: float
    windows: int
    thumbnail: bytes = b""
    closed: bool = False

    def to_dict(self) -> Dict[str, Any]:
        """Returns the record as JSON-ready plain types, without the thumbnail's bytes."""
        return {"id": self.id, "camera": self.camera, "text": self.text,
                "start_time": round(self.start_time, 3), "end_time": round(self.end_time, 3),
                "confidence": round(self.confidence, 4), "windows": self.windows,
                "has_thumbnail": bool(self.thumbnail), "closed": self.closed}
