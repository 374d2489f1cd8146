"""Events: runs of consecutive windows of one camera that say the same thing.

A caption stream says the same sentence again and again while nothing
changes; an event is what a person wants instead: what was seen, from when to
when, how sure the model was, and a thumbnail.

``EventTracker`` turns one camera's captions into events by the rule of
``EventRule`` (docs/runtime.md, "Events"): windows whose captions are
*near-same* (the same content words in the same order) merge; a caption that
differs opens a new event at once if it is confident, else only once
``confirm_windows`` consecutive windows agree on it, so that a one-window
flicker stays inside the event it interrupted. A window of an unknown scene
(``Caption.scene``, ``edgecap.domain``) opens no event: ``confirm_windows`` of
them in a row close the event in progress, fewer are a flicker inside it, and
after them a caption opens an event only once ``confirm_windows`` windows
agree on it. Every window of a known scene (or of a bundle without a
calibration, whose scene is not judged) belongs to exactly one event.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Literal, Optional, Protocol, Tuple

import cv2
import numpy as np

from edgecap.domain import UNKNOWN


class CaptionLike(Protocol):
    """What the tracker reads of a window's caption (``edgecap.captioner.Caption`` has it).

    The captioner imports this module for ``EdgeCaptioner.events``; naming its
    ``Caption`` here would make an import circle.
    """

    text: str
    start_time: float
    end_time: float
    confidence: float
    scene: Optional[str]

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
      thumbnail_stored: True when a reader left out a thumbnail it holds
        (``History.search`` does not load them): the event has one all the same.
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
    thumbnail_stored: bool = False

    def to_dict(self) -> Dict[str, Any]:
        """Returns the record as JSON-ready plain types, without the thumbnail's bytes."""
        return {"id": self.id, "camera": self.camera, "text": self.text,
                "start_time": round(self.start_time, 3), "end_time": round(self.end_time, 3),
                "confidence": round(self.confidence, 4), "windows": self.windows,
                "has_thumbnail": bool(self.thumbnail) or self.thumbnail_stored, "closed": self.closed}


@dataclass(frozen=True)
class EventRule:
    """The constants of the event rule, in one place (docs/runtime.md, "Events").

    Attributes:
      confirm_windows: Consecutive windows that must agree on a new caption
        before it closes the event in progress (when none of them is confident).
      confident: A window whose ``Caption.confidence`` (mean token
        log-probability, <= 0) is at least this changes the event at once;
        ``log(0.9)``: its tokens average a probability of 0.9 or more.
      filler_words: Words ignored when comparing captions: captions with the
        same other words in the same order are near-same.
      thumbnail_width: Width of the thumbnail in pixels (a narrower frame is
        kept as it is).
      thumbnail_quality: JPEG quality of the thumbnail (1-100).
    """

    confirm_windows: int = 2
    confident: float = math.log(0.9)
    filler_words: FrozenSet[str] = field(default_factory=lambda: frozenset(
        {"a", "an", "the", "is", "are", "was", "were", "be", "being", "it", "its", "of", "some"}))
    thumbnail_width: int = 160
    thumbnail_quality: int = 70

    def __post_init__(self) -> None:
        if self.confirm_windows < 1:
            raise ValueError(f"event rule: confirm_windows={self.confirm_windows}; use 1 or more")
        if not 1 <= self.thumbnail_quality <= 100 or self.thumbnail_width < 1:
            raise ValueError("event rule: thumbnail_width >= 1 and thumbnail_quality 1-100")

    def key(self, text: str) -> Tuple[str, ...]:
        """Returns what two near-same captions share: their content words, lower case, in order."""
        return tuple(w for w in re.findall(r"[^\W_]+(?:'[^\W_]+)?", text.lower())
                     if w not in self.filler_words)

    def is_confident(self, confidence: float) -> bool:
        """True if a window this sure changes the event at once."""
        return confidence >= self.confident


def thumbnail(image: np.ndarray, rule: EventRule = EventRule()) -> bytes:
    """Returns a frame as a small JPEG, scaled down to ``rule.thumbnail_width`` pixels wide.

    Args:
      image: HxWx3 uint8 BGR.
      rule: The width and quality.

    Returns:
      The JPEG's bytes; b"" when OpenCV cannot encode the frame (an event
      without a picture is still an event).
    """
    try:
        height, width = image.shape[:2]
        if width > rule.thumbnail_width:
            size = (rule.thumbnail_width, max(1, round(height * rule.thumbnail_width / width)))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, rule.thumbnail_quality])
    except (cv2.error, AttributeError, ValueError):
        return b""
    return jpeg.tobytes() if ok else b""


@dataclass
class _Window:
    """A window waiting for its change to be confirmed; ``key`` None for a scene the model does not know."""

    text: str
    key: Optional[Tuple[str, ...]]
    start: float
    end: float
    confidence: float
    image: Optional[np.ndarray]


class EventTracker:
    """Turns one camera's captions, in order, into events (not thread-safe: one caller).

    ``update`` and ``close`` return the changes to report, in order, as
    ``(event, change)`` pairs; each event is a copy, so a sink may keep it.

    Args:
      camera: The camera's name (``""`` for the Python API's single source).
      rule: The rule (default ``EventRule()``).
    """

    def __init__(self, camera: str, rule: Optional[EventRule] = None) -> None:
        self.camera = camera
        self.rule = rule or EventRule()
        self._event: Optional[Event] = None
        self._key: Tuple[str, ...] = ()
        self._pending: List[_Window] = []  # windows that differ from the event, not yet confirmed
        self._after_unknown = False  # the last windows were unknown scenes: the next event must be confirmed

    @property
    def current(self) -> Optional[Event]:
        """A copy of the event in progress (without the windows still pending), or None."""
        return None if self._event is None else dataclasses.replace(self._event)

    def update(self, caption: CaptionLike, image: Optional[np.ndarray] = None,
               start: Optional[float] = None, end: Optional[float] = None) -> List[Tuple[Event, Change]]:
        """Takes the next window's caption.

        Args:
          caption: The window's caption (its text and confidence are read).
          image: The frame that completed the window, for the thumbnail.
          start: The window's start on the events' clock (default ``caption.start_time``).
          end: Its end (default ``caption.end_time``).

        Returns:
          The changes, in order: ``opened`` for a first window, ``extended``
          when it (and any flicker before it) joined the event in progress,
          ``closed`` then ``opened`` when a change is confirmed, ``closed``
          alone when an unknown scene is, nothing while a change waits for
          confirmation or no event is open in an unknown scene.
        """
        unknown = getattr(caption, "scene", None) == UNKNOWN
        window = _Window(caption.text, None if unknown else self.rule.key(caption.text),
                         caption.start_time if start is None else start,
                         caption.end_time if end is None else end, caption.confidence, image)
        if self._event is None:
            return self._start(window)
        if window.key == self._key:
            # The windows that differed in between were a flicker: they stay in this event.
            for w in self._pending + [window]:
                self._add(w)
            self._pending = []
            return [(self.current, "extended")]
        if self._pending and window.key != self._pending[-1].key:
            # A run that never reached confirmation was a flicker of the event in progress.
            for w in self._pending:
                self._add(w)
            self._pending = []
        self._pending.append(window)
        confirmed = len(self._pending) >= self.rule.confirm_windows
        if unknown:  # never at once: one unsure window of the model's own world is no scene change
            if not confirmed:
                return []
            self._pending, self._after_unknown = [], True  # they belong to no event
            return [self._close()]
        if not confirmed and not self.rule.is_confident(window.confidence):
            return []
        closed = self._close()
        return [closed, self._open(self._pending)]

    def _start(self, window: _Window) -> List[Tuple[Event, Change]]:
        """A window while no event is open: the first opens one at once; after unknown scenes, a confirmed run."""
        if window.key is None:
            self._pending, self._after_unknown = [], True
            return []
        if not self._after_unknown:
            return [self._open([window])]
        # The model was just found not to know what it saw: its confidence is no reason to believe it at once.
        if self._pending and window.key != self._pending[-1].key:
            self._pending = []
        self._pending.append(window)
        return [self._open(self._pending)] if len(self._pending) >= self.rule.confirm_windows else []

    def close(self) -> List[Tuple[Event, Change]]:
        """Closes the event in progress (camera offline, end of the source, stop).

        Windows still waiting for confirmation join it: too few to make an event of their own
        (with no event in progress, they are dropped).

        Returns:
          ``[(event, "closed")]``, or ``[]`` when no event is in progress.
        """
        if self._event is None:
            self._pending, self._after_unknown = [], False  # what follows is a new stream
            return []
        for w in self._pending:
            self._add(w)
        self._pending = []
        return [self._close()]

    def _open(self, windows: List[_Window]) -> Tuple[Event, Change]:
        first = windows[0]
        self._event = Event(id=f"{self.camera}@{round(first.start * 1000)}", camera=self.camera,
                            text=first.text, start_time=first.start, end_time=first.end,
                            confidence=-math.inf, windows=0)
        assert first.key is not None
        self._key = first.key
        self._pending, self._after_unknown = [], False
        for w in windows:
            self._add(w)
        return (self.current, "opened")

    def _add(self, w: _Window) -> None:
        event = self._event
        assert event is not None
        event.end_time = max(event.end_time, w.end)
        event.windows += 1
        if w.key == self._key and w.confidence > event.confidence:
            # The first of its most confident windows names the event and gives its picture.
            event.text, event.confidence = w.text, w.confidence
            if w.image is not None:
                event.thumbnail = thumbnail(w.image, self.rule)

    def _close(self) -> Tuple[Event, Change]:
        event = self._event
        assert event is not None
        event.closed = True
        self._event = None
        return (dataclasses.replace(event), "closed")
