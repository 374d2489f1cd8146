"""The event history over HTTP: /api/events and its thumbnails, against a fake History."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterator, List, Optional
from urllib.parse import urljoin

import pytest

from edgecap.service.http import EVENTS_LIMIT, StatusServer, events_query, parse_time
from edgecap.service.state import ServiceState
from fake_history import FakeHistory, event
from test_http import TOKEN, request

JPEG_A = b"\xff\xd8\xff\xe0thumbnail-a\xff\xd9"
JPEG_B = b"\xff\xd8\xff\xe0thumbnail-b\xff\xd9"
T0 = 1_764_640_000.0  # 2025-12-02T01:46:40Z


@pytest.fixture
def history() -> FakeHistory:
    return FakeHistory([
        event("front", "a man is playing a guitar", T0, thumbnail=JPEG_A),
        event("front", "a red star is spinning", T0 + 60, thumbnail=JPEG_B),
        event("back", "a dog runs on a red star rug", T0 + 120, thumbnail=JPEG_B),
        event("back", "a cat sleeps", T0 + 180),
    ])


@pytest.fixture
def server(history: FakeHistory) -> Iterator[StatusServer]:
    with StatusServer(ServiceState(["front", "back"]), None, port=0, history=history) as srv:
        yield srv


def events(server: StatusServer, query: str, headers: Optional[dict] = None) -> List[dict]:
    status, headers_, body = request(server, "/api/events" + query, headers=headers)
    assert status == 200 and headers_["content-type"] == "application/json", body
    return json.loads(body)["events"]


def test_a_search_lists_matching_events_newest_first_with_thumbnail_urls(server: StatusServer,
                                                                         history: FakeHistory) -> None:
    found = events(server, '?q=%22red+star%22')
    assert [e["text"] for e in found] == ["a dog runs on a red star rug", "a red star is spinning"]
    first = found[0]
    assert first["id"] == f"back@{round((T0 + 120) * 1000)}" and first["camera"] == "back"
    assert first["start_time"] == T0 + 120 and first["end_time"] == T0 + 130
    assert first["confidence"] == -0.2 and first["closed"] is True and first["windows"] >= 1
    # The thumbnail's address is relative to /api/events itself: resolved there, it is the JPEG.
    url = urljoin(f"http://127.0.0.1:{server.port}/api/events?q=red", first["thumbnail"])
    status, headers, body = request(server, url.split(str(server.port), 1)[1])
    assert status == 200 and headers["content-type"] == "image/jpeg" and body == JPEG_B
    assert history.searches[-1] == {"q": '"red star"', "camera": "", "since": None, "until": None, "limit": 50}


def test_an_event_without_a_thumbnail_has_no_thumbnail_url(server: StatusServer) -> None:
    found = {e["text"]: e for e in events(server, "?camera=back")}
    assert found["a cat sleeps"]["thumbnail"] is None and found["a cat sleeps"]["has_thumbnail"] is False
    assert found["a dog runs on a red star rug"]["has_thumbnail"] is True


def test_camera_time_range_and_limit_reach_the_history(server: StatusServer, history: FakeHistory) -> None:
    found = events(server, f"?camera=front&since={T0 + 30}&until={T0 + 1000}&limit=5")
    assert [e["text"] for e in found] == ["a red star is spinning"]
    assert history.searches[-1] == {"q": "", "camera": "front", "since": T0 + 30, "until": T0 + 1000,
                                    "limit": 5}
    iso = datetime.fromtimestamp(T0 + 30, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert [e["text"] for e in events(server, f"?since={iso}&camera=front")] == ["a red star is spinning"]
    assert history.searches[-1]["since"] == T0 + 30
    assert len(events(server, "?limit=2")) == 2


def test_times_read_as_unix_seconds_or_iso_8601() -> None:
    assert parse_time("1764640000") == parse_time("2025-12-02T01:46:40Z") == 1764640000.0
    assert parse_time("2025-12-02T02:46:40+01:00") == parse_time("1764640000.0")
    local = datetime(2025, 12, 2, 1, 46, 40).timestamp()  # no offset: this machine's local time
    assert parse_time("2025-12-02T01:46:40") == local
    assert parse_time("2025-12-02") == datetime(2025, 12, 2).timestamp()


@pytest.mark.parametrize("query, words", [
    ("limit=0", "limit '0'; give a whole number from 1 to 500"),
    (f"limit={EVENTS_LIMIT + 1}", "limit '501'"),
    ("limit=ten", "limit 'ten'"),
    ("limit=-3", "limit '-3'"),
    ("since=yesterday", "since: 'yesterday' is not a time; give Unix seconds or ISO-8601"),
    ("until=nan", "until: 'nan' is not a time"),
    ("since=inf", "since: 'inf' is not a time"),
    ("since=2026-13-40", "since: '2026-13-40' is not a time"),
    (f"since={T0 + 10}&until={T0}", "since is after until"),
    ("camera=..%2Fetc", "camera '../etc' is not a camera name"),
    ("camera=" + "a" * 65, "is not a camera name"),
    ("q=" + "x" * 201, "q is 201 characters; search with at most 200"),
    ("query=cat", "unknown parameter 'query'; use q, camera, since, until and limit"),
    ("q=cat&q=dog", "parameter 'q' given 2 times; give it once"),
    ("&".join(f"q{i}=1" for i in range(20)), "too many query parameters"),
])
def test_a_bad_parameter_is_a_one_line_400(server: StatusServer, history: FakeHistory, query: str,
                                           words: str) -> None:
    before = len(history.searches)
    status, headers, body = request(server, "/api/events?" + query)
    error = json.loads(body)["error"]
    assert status == 400 and headers["content-type"] == "application/json"
    assert words in error and "\n" not in error and len(error) < 200
    assert len(history.searches) == before  # refused before the history is asked


def test_events_query_defaults() -> None:
    assert events_query("") == {"q": "", "camera": "", "since": None, "until": None, "limit": 50}
    assert events_query("q=&camera=&since=&until=&limit=")["limit"] == 50  # a form's empty fields


def test_thumbnails_unknown_malformed_and_missing_are_404(server: StatusServer) -> None:
    assert request(server, f"/api/events/front@{round(T0 * 1000)}/thumbnail.jpg")[2] == JPEG_A
    # The page quotes the id with encodeURIComponent: @ arrives as %40.
    assert request(server, f"/api/events/front%40{round(T0 * 1000)}/thumbnail.jpg")[2] == JPEG_A
    status, headers, _ = request(server, f"/api/events/front@{round(T0 * 1000)}/thumbnail.jpg", method="HEAD")
    assert status == 200 and int(headers["content-length"]) == len(JPEG_A)
    for path in (f"/api/events/back@{round((T0 + 180) * 1000)}/thumbnail.jpg",  # an event without one
                 "/api/events/front@1/thumbnail.jpg", "/api/events/..%2F..%2Fstate.py/thumbnail.jpg",
                 "/api/events/front/thumbnail.jpg", "/api/events/a@b@1/thumbnail.jpg"):
        status, _, body = request(server, path)
        assert status == 404 and "error" in json.loads(body), path


def test_both_routes_need_the_token_like_the_other_api_routes(history: FakeHistory) -> None:
    thumb = f"/api/events/front@{round(T0 * 1000)}/thumbnail.jpg"
    with StatusServer(ServiceState(["front"]), None, port=0, token=TOKEN, history=history) as srv:
        for path in ("/api/events?q=red", thumb):
            status, headers, body = request(srv, path)
            assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
            assert b"red star" not in body and JPEG_A not in body
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert len(events(srv, "?q=red", headers=bearer)) == 2
        assert request(srv, thumb, headers=bearer)[2] == JPEG_A
        # A bad query from someone without the token learns nothing, not even that it was bad.
        assert request(srv, "/api/events?limit=0")[0] == 401
        # The icon is public like the style: the login form shows it too.
        status, headers, body = request(srv, "/static/icon.svg")
        assert status == 200 and headers["content-type"] == "image/svg+xml" and body.startswith(b"<svg")


def test_without_a_history_the_list_is_empty_and_the_page_has_no_search_box() -> None:
    with StatusServer(ServiceState(["front"]), None, port=0) as srv:
        assert events(srv, "?q=red") == []
        assert request(srv, "/api/events?limit=0")[0] == 400  # still validated: a script learns its mistake
        assert request(srv, "/api/events/front@1/thumbnail.jpg")[0] == 404
        page = request(srv, "/")[2]
        assert b'id="q"' not in page and b'id="cameras"' in page


def test_with_a_history_the_page_has_the_search_box(server: StatusServer) -> None:
    page = request(server, "/")[2]
    assert b'<input id="q"' in page and b'role="search"' in page


def test_thumbnails_of_events_the_state_keeps_are_served_without_a_history() -> None:
    class EventState(ServiceState):  # the state's event_thumbnail (the events part of issue 18)
        def event_thumbnail(self, event_id: str) -> Optional[bytes]:
            return JPEG_B if event_id == "front@5000" else None

    with StatusServer(EventState(["front"]), None, port=0) as srv:
        assert request(srv, "/api/events/front@5000/thumbnail.jpg")[2] == JPEG_B
        assert request(srv, "/api/events/front@6000/thumbnail.jpg")[0] == 404


def test_a_failing_history_is_a_one_line_503_and_the_server_goes_on(caplog) -> None:
    class Broken(FakeHistory):
        def search(self, *args, **kwargs):
            raise OSError("disk I/O error")

        def thumbnail(self, event_id: str) -> Optional[bytes]:
            raise OSError("disk I/O error")

    with StatusServer(ServiceState(["front"]), None, port=0, history=Broken([])) as srv:
        status, _, body = request(srv, "/api/events?q=x")
        assert status == 503 and json.loads(body) == {"error": "the history cannot be searched now: disk I/O error"}
        assert request(srv, "/api/events/front@1/thumbnail.jpg")[0] == 404
        assert request(srv, "/api/stats")[0] == 200
    assert "history search failed: disk I/O error" in caplog.text
