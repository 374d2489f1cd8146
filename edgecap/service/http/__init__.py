"""The service's HTTP server: health, metrics, a JSON API and the status page.

Standard library only, in three rooms: ``server`` (the connections: one
selector thread reads every request under a deadline, a few workers answer,
a cap keeps a crowd of slow clients from taking the process's files),
``sessions`` (the access token, login sessions and the failed-login limiter)
and ``routes`` (what each request gets). ``app.StatusServer`` puts them
together over the service's state, metrics and history.

Bound to a loopback address it needs no login (and refuses requests naming a
foreign Host, which is how a web page would reach it by DNS rebinding); bound
to any other address it refuses to start without an access token.

The page polls ``/api/stats`` once a second rather than holding a
server-sent-events stream: a poll holds a worker for a millisecond, passes any
proxy and resumes by itself after a restart. Whatever needs pushed events
(home automation, a fleet) has the MQTT sink.
"""

from edgecap.service.http.app import StatusServer
from edgecap.service.http.routes import EVENTS_LIMIT, HistoryReader, events_query, parse_time, thumbnail_url

__all__ = ["EVENTS_LIMIT", "HistoryReader", "StatusServer", "events_query", "parse_time", "thumbnail_url"]
