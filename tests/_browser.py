"""A small headless-Chromium driver for the web page tests: the DevTools protocol over a pipe.

Chromium is started with ``--remote-debugging-pipe``: it reads protocol commands from fd 3 and
writes replies and events to fd 4, each message JSON ending with a NUL byte. No websocket, no
port, nothing but the standard library. One reader thread routes replies to their callers (by
``id``) and keeps events per session.

    with Browser.start(tmp_path) as b:
        page = b.new_page()
        page.goto("http://127.0.0.1:8000/")
        page.wait_for("document.body.dataset.state === 'done'")
        page.screenshot(tmp_path / "page.png")
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Chromium's executable: ``COLGRAPH_CHROMIUM`` when set, else the first of CANDIDATES on PATH."""
    env = os.environ.get("COLGRAPH_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless Chromium process and its protocol pipe."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int, profile: str):
        self.proc, self._out, self._in, self.profile = proc, to_browser, from_browser, profile
        self._next = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[int, dict] = {}
        self.events: dict[str | None, list[dict]] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True, name="cdp-reader")
        self._reader.start()

    @classmethod
    def start(cls, workdir: Path | None = None, width: int = 1360, height: int = 1000) -> Browser:
        exe = find_chromium()
        if exe is None:
            raise FileNotFoundError("Chromium not found")
        profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir)
        cmd_r, cmd_w = os.pipe()  # we write commands to cmd_w; Chromium reads them on fd 3
        res_r, res_w = os.pipe()  # Chromium writes on fd 4; we read res_r

        def child_fds():  # in the child, before exec: the pipe ends on fds 3 and 4
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-extensions", "--disable-default-apps", "--no-first-run", "--no-default-browser-check",
                "--mute-audio", "--hide-scrollbars", "--force-color-profile=srgb", "--font-render-hinting=none",
                f"--window-size={width},{height}", f"--user-data-dir={profile}", "--remote-debugging-pipe",
                "about:blank"]
        proc = subprocess.Popen(args, pass_fds=(3, 4), preexec_fn=child_fds, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(cmd_r)
        os.close(res_w)
        b = cls(proc, cmd_w, res_r, profile)
        try:
            b.call("Browser.getVersion", timeout=60)
        except BaseException:
            b.close()
            raise
        return b

    # -- the pipe -------------------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._in, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self._cond:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.setdefault(msg.get("sessionId"), []).append(msg)
                self._cond.notify_all()

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        with self._lock:
            self._next += 1
            mid = self._next
            msg = {"id": mid, "method": method, "params": params or {}}
            if session is not None:
                msg["sessionId"] = session
            data = json.dumps(msg).encode() + b"\0"
            while data:
                data = data[os.write(self._out, data):]
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._replies:
                left = deadline - time.monotonic()
                if self._closed:
                    raise CDPError(f"{method}: Chromium went away")
                if left <= 0:
                    raise TimeoutError(f"{method}: no reply in {timeout} s")
                self._cond.wait(left)
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, session: str | None, method: str, timeout: float = 30, since: int = 0) -> dict:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events.get(session, [])[since:]:
                    if ev["method"] == method:
                        return ev
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise TimeoutError(f"no {method} event in {timeout} s")
                self._cond.wait(left)

    # -- pages ------------------------------------------------------------------------------------
    def new_page(self, width: int = 1360, height: int = 1000) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                          "mobile": False})
        return page

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close", timeout=5)
                except Exception:
                    pass
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            for fd in (self._out, self._in):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    """One tab: navigation, script evaluation, input, screenshots."""

    def __init__(self, browser: Browser, target: str, session: str):
        self.browser, self.target, self.session = browser, target, session

    def call(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        return self.browser.call(method, params, self.session, timeout)

    @property
    def events(self) -> list[dict]:
        return self.browser.events.get(self.session, [])

    def errors(self) -> list[str]:
        """Uncaught exceptions, console errors and browser log errors (CSP violations among them)."""
        out = []
        for ev in list(self.events):
            p = ev.get("params", {})
            if ev["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(f"{p['entry'].get('source')}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def on_new_document(self, script: str) -> None:
        """Runs `script` in every document this page loads, before the page's own scripts."""
        self.call("Page.addScriptToEvaluateOnNewDocument", {"source": script})

    def goto(self, url: str, timeout: float = 60) -> None:
        since = len(self.events)
        reply = self.call("Page.navigate", {"url": url}, timeout)
        if reply.get("errorText"):
            raise CDPError(f"navigate {url}: {reply['errorText']}")
        self.browser.wait_event(self.session, "Page.loadEventFired", timeout, since)

    def eval(self, expression: str, timeout: float = 60):
        """The value of a JavaScript expression (awaited when it is a promise), as JSON."""
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True,
                                           "userGesture": True}, timeout)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CDPError(f"{expression[:80]}: {d.get('exception', {}).get('description') or d.get('text')}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60, interval: float = 0.05):
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.eval(expression)
            except CDPError as exc:  # the page is between documents (a navigation): ask again
                if "context" not in str(exc).lower() and "navigat" not in str(exc).lower():
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {expression!r}; page errors: {self.errors()}")
            time.sleep(interval)

    def set_files(self, selector: str, paths: list[Path]) -> None:
        """Puts files into an ``<input type=file>`` (fires its change event, as a user's choice does)."""
        root = self.call("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node = self.call("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        if not node:
            raise CDPError(f"no element {selector!r}")
        self.call("DOM.setFileInputFiles", {"nodeId": node, "files": [str(p) for p in paths]})

    def key(self, key: str, code: str | None = None, text: str | None = None, modifiers: int = 0) -> None:
        """Presses and releases one key (``Tab``, ``Enter``, ...) as the keyboard would."""
        vk = {"Tab": 9, "Enter": 13, "Escape": 27, " ": 32}.get(key, 0)
        base = {"key": key, "code": code or key, "windowsVirtualKeyCode": vk, "modifiers": modifiers}
        text = {"Enter": "\r", " ": " "}.get(key) if text is None else text
        down = dict(base, type="keyDown")
        if text is not None:  # a key that types: keypress follows (Enter submits a form)
            down["text"] = down["unmodifiedText"] = text
        self.call("Input.dispatchKeyEvent", down)
        self.call("Input.dispatchKeyEvent", dict(base, type="keyUp"))

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params = {"format": "png"}
        if full_page:
            size = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1})
        data = base64.b64decode(self.call("Page.captureScreenshot", params, 60)["data"])
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})
