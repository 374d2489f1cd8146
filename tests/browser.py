"""Headless Chromium driven over the DevTools protocol on a pipe, for the status page's tests.

Standard library only: with ``--remote-debugging-pipe`` the browser reads
JSON commands ended by NUL on its descriptor 3 and writes replies and events
on 4. A ``Browser`` opens one page, keeps every event (requests, console
messages, exceptions) for the test to look at afterwards, evaluates script,
presses keys as a keyboard does and takes screenshots.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TIMEOUT_S = 30.0  # for any one reply: a hung browser fails the test instead of hanging the suite
# What an evaluation answers when its document goes away under it.
_NAVIGATED = ("Inspected target navigated or closed", "Execution context was destroyed",
              "Cannot find context with specified id")
_KEYS = {"Tab": 9, "Enter": 13, "Escape": 27, "ArrowDown": 40, "ArrowUp": 38}


class BrowserError(Exception):
    """The browser answered a command with an error, or a script threw."""


class Browser:
    """One headless Chromium with one page.

    Args:
      profile: A fresh directory for the browser's profile.
      width: The viewport's width in CSS pixels.
      height: Its height.
      mobile: Emulate a phone (touch, mobile viewport rules).
      scale: Device pixels per CSS pixel (screenshots come out this much larger).
    """

    def __init__(self, profile: Path, width: int = 1280, height: int = 900, mobile: bool = False,
                 scale: float = 1.0) -> None:
        if CHROMIUM is None:
            raise FileNotFoundError("no chromium: apt-get install chromium")
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Above 4, so that placing them at 3 and 4 in the child overwrites neither.
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        for fd in (to_browser_r, from_browser_w):
            os.close(fd)

        def place() -> None:
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        cmd = [CHROMIUM, "--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run",
               "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--hide-scrollbars",
               f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(cmd, pass_fds=(3, 4), preexec_fn=place,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(child_r)
        os.close(child_w)
        self._out = to_browser_w
        self._in = from_browser_r
        self._buf = b""
        self._id = 0
        self.events: List[Dict[str, Any]] = []
        try:
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Network", "Log"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                      deviceScaleFactor=scale, mobile=mobile)
        except BaseException:
            self.close()
            raise

    # -- the protocol ------------------------------------------------------

    def _call(self, method: str, params: Dict[str, Any], session: Optional[str] = None) -> Dict[str, Any]:
        self._id += 1
        message: Dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        reply = self._read(lambda m: m.get("id") == self._id, method)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply["result"]

    def _read(self, wanted: Callable[[Dict[str, Any]], bool], what: str) -> Dict[str, Any]:
        """Reads messages, keeping the events, until one is ``wanted``; returns it."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                message = json.loads(raw)
                if "id" not in message:
                    self.events.append(message)
                if wanted(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError(f"chromium: no {what} in {TIMEOUT_S:.0f} s")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited (code {self.proc.poll()}) waiting for {what}")
            self._buf += chunk

    def call(self, method: str, **params: Any) -> Dict[str, Any]:
        """Sends one DevTools command to the page; returns its result."""
        return self._call(method, params, self._session)

    # -- what a test does ----------------------------------------------------

    def goto(self, url: str) -> None:
        """Loads ``url`` and waits until its document and deferred scripts have run."""
        seen = len(self.events)
        result = self.call("Page.navigate", url=url)
        if "errorText" in result:
            raise BrowserError(f"cannot load {url}: {result['errorText']}")
        if not any(e.get("method") == "Page.loadEventFired" for e in self.events[seen:]):
            self._read(lambda m: m.get("method") == "Page.loadEventFired", "load event")

    def evaluate(self, expression: str) -> Any:
        """Runs ``expression`` in the page (a promise is awaited); returns its JSON value.

        Raises:
          BrowserError: The script threw.
        """
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout_s: float = 20.0) -> Any:
        """Waits until the script ``condition`` is truthy in the page; returns its value.

        A navigation meanwhile (a form's submission, a redirect) is waited
        through: the condition is then checked in the new document.

        Raises:
          TimeoutError: Still falsy after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                value = self.evaluate(f"""new Promise((done) => {{
                    const end = Date.now() + {max(0.0, left) * 1000};
                    const check = () => {{
                      let v; try {{ v = ({condition}); }} catch (e) {{ v = false; }}
                      if (v || Date.now() > end) done(v || false); else setTimeout(check, 50);
                    }};
                    check();
                }})""")
            except BrowserError as e:
                if not any(s in str(e) for s in _NAVIGATED) or left <= 0:
                    raise
                continue
            if not value:
                raise TimeoutError(f"not true after {timeout_s:g} s: {condition}")
            return value

    def press(self, key: str) -> None:
        """Presses and releases a named key (``Tab``, ``Enter``, ...) as a keyboard would."""
        code = _KEYS[key]
        text = {"Enter": "\r"}.get(key)
        down: Dict[str, Any] = {"type": "keyDown" if text else "rawKeyDown", "key": key, "code": key,
                                "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code}
        if text:
            down["text"] = down["unmodifiedText"] = text
        self.call("Input.dispatchKeyEvent", **down)
        self.call("Input.dispatchKeyEvent", type="keyUp", key=key, code=key, windowsVirtualKeyCode=code,
                  nativeVirtualKeyCode=code)

    def type(self, text: str) -> None:
        """Types ``text`` a key at a time into whatever has the focus."""
        for ch in text:
            self.call("Input.dispatchKeyEvent", type="keyDown", key=ch, text=ch, unmodifiedText=ch)
            self.call("Input.dispatchKeyEvent", type="keyUp", key=ch)

    def screenshot(self, path: Path) -> None:
        """Saves what the viewport shows as a PNG."""
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    @property
    def requests(self) -> List[str]:
        """Every URL the page requested, in order."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    @property
    def problems(self) -> List[str]:
        """Console errors and warnings, uncaught exceptions and the browser's own error log entries."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning", "assert"):
                found.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                     for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append("exception: " + (details.get("exception", {}).get("description") or details["text"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                entry = params["entry"]
                found.append(f"log ({entry.get('source')}): {entry['text']} {entry.get('url', '')}".strip())
        return found

    def close(self) -> None:
        """Closes the browser and waits for it to exit."""
        try:
            if self.proc.poll() is None:
                try:
                    self._call("Browser.close", {})
                except (BrowserError, TimeoutError, OSError):
                    pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        finally:
            for fd in (self._out, self._in):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
