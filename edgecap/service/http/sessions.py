"""Who may read the status server: its access token, login sessions and the failed-login limiter.

A server bound to a loopback address needs no login; any other needs an
access token, sent as ``Authorization: Bearer <token>`` or exchanged at
``/login`` for a session cookie. A login makes a fresh random session
(``SESSION_MAX_AGE_S``, at most ``MAX_SESSIONS`` at once), a logout ends it.
Failed logins and wrong bearer tokens are logged as warnings (never what was
sent) and, past ``LOGIN_ATTEMPTS`` in ``LOGIN_WINDOW_S`` from one address,
refused until the oldest failure leaves the window.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import secrets
import threading
import time
from typing import Deque, Optional

log = logging.getLogger(__name__)

COOKIE = "edgecap_session"
SESSION_MAX_AGE_S = 7 * 24 * 3600
MAX_SESSIONS = 64  # the oldest session ends when a login would make one more
LOGIN_ATTEMPTS = 5  # failed logins (or bearer tokens) from one address ...
LOGIN_WINDOW_S = 60.0  # ... in this long, then 429 until the oldest leaves the window
_ADDRESSES_MAX = 4096  # addresses the login limiter remembers


class Sessions:
    """Login sessions: random ids with an expiry, kept (hashed) in memory only."""

    def __init__(self, max_age_s: float = SESSION_MAX_AGE_S, limit: int = MAX_SESSIONS) -> None:
        self.max_age_s = max_age_s
        self.clock = time.monotonic  # replaceable: tests move time for this alone
        self._limit = limit
        self._expiry: "collections.OrderedDict[bytes, float]" = collections.OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(session: str) -> bytes:
        # Kept hashed: the lookup's timing depends on a hash of what the client sent, not on the ids.
        return hashlib.sha256(session.encode("latin-1", "replace")).digest()

    def new(self) -> str:
        """A fresh session id, valid for ``max_age_s``."""
        session = secrets.token_urlsafe(32)
        with self._lock:
            self._expiry[self._key(session)] = self.clock() + self.max_age_s
            while len(self._expiry) > self._limit:
                self._expiry.popitem(last=False)
        return session

    def valid(self, session: str) -> bool:
        """Says whether ``session`` was made here, has not expired and was not ended."""
        key = self._key(session)
        with self._lock:
            expiry = self._expiry.get(key)
            if expiry is not None and expiry <= self.clock():
                del self._expiry[key]
                expiry = None
        return expiry is not None

    def end(self, session: str) -> None:
        """Ends ``session`` (logout, or a new login from the same browser)."""
        with self._lock:
            self._expiry.pop(self._key(session), None)


class Attempts:
    """Failed logins by client address, to refuse an address that keeps guessing."""

    def __init__(self, limit: int = LOGIN_ATTEMPTS, window_s: float = LOGIN_WINDOW_S) -> None:
        self.limit = limit
        self.window_s = window_s
        self.clock = time.monotonic  # replaceable: tests move time for this alone
        self._failures: "collections.OrderedDict[str, Deque[float]]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        now = self.clock()
        with self._lock:
            times = self._failures.get(address)
            if times is None:
                return 0.0
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if not times:
                del self._failures[address]
                return 0.0
            return times[0] + self.window_s - now if len(times) >= self.limit else 0.0

    def failed(self, address: str) -> int:
        """Records a failure from ``address``; returns its failures in the window."""
        with self._lock:
            times = self._failures.pop(address, None) or collections.deque(maxlen=self.limit)
            times.append(self.clock())
            self._failures[address] = times  # most recent last: the oldest go first
            while len(self._failures) > _ADDRESSES_MAX:
                self._failures.popitem(last=False)
            return len(times)


class Access:
    """The token check, the sessions and the limiter of one server.

    Args:
      token: The access token; None for a server that needs no login.
    """

    def __init__(self, token: Optional[str]) -> None:
        self.token = None if token is None else token.encode("ascii")
        self.sessions = Sessions()
        self.attempts = Attempts()

    @property
    def required(self) -> bool:
        """Whether requests need the token (or a session)."""
        return self.token is not None

    def bearer_wait(self, bearer: Optional[str], address: str) -> float:
        """Seconds a client that sends a bearer token must wait after too many wrong ones (0: none)."""
        if self.token is None or bearer is None:
            return 0.0
        return self.attempts.retry_after(address)

    def authorized(self, bearer: Optional[str], session: Optional[str], address: str) -> bool:
        """Says whether a request may read: no token needed, the right bearer token, or a live session.

        Args:
          bearer: The ``Authorization: Bearer`` token sent, if any (a wrong one is counted).
          session: The session cookie sent, if any.
          address: The client's address.
        """
        if self.token is None:
            return True
        if bearer is not None:
            if hmac.compare_digest(bearer.encode("latin-1", "replace"), self.token):
                return True
            self.failed("a wrong bearer token", address)
            return False
        return session is not None and self.sessions.valid(session)

    def login(self, given: str, old_session: Optional[str], address: str) -> Optional[str]:
        """Checks a login form's token; a right one ends ``old_session`` and returns a new session id.

        Args:
          given: The token typed into the form.
          old_session: The session cookie the browser sent, if any.
          address: The client's address (a wrong token is counted against it).

        Returns:
          The new session id, or None for a wrong token.
        """
        assert self.token is not None
        if not hmac.compare_digest(given.strip().encode("latin-1", "replace"), self.token):
            self.failed("a failed login", address)
            return None
        if old_session is not None:  # a fresh id on each login: one fixed before it is worthless
            self.sessions.end(old_session)
        log.info("http: login from %s", address)
        return self.sessions.new()

    def failed(self, what: str, address: str) -> None:
        """Logs a failed login (never what was sent) and counts it against the client's address."""
        count = self.attempts.failed(address)
        log.warning("http: %s from %s (%d in %.0f s)", what, address, count, self.attempts.window_s)
        if count == self.attempts.limit:
            log.warning("http: refusing logins from %s for %.0f s (%d failures)", address,
                        self.attempts.window_s, count)

    def session_cookie(self, session: str) -> str:
        """The ``Set-Cookie`` value that gives the browser ``session``."""
        return (f"{COOKIE}={session}; Path=/; Max-Age={int(self.sessions.max_age_s)}; "
                f"HttpOnly; SameSite=Strict")


LOGOUT_COOKIE = f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
