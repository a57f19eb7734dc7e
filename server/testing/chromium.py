"""Headless Chromium driven over the DevTools protocol, on the websockets library alone.

Owns starting a throwaway Chromium (its own profile directory, no network beyond what the page
opens, no first-run or component updates), opening one page, evaluating JavaScript in it and
taking screenshots. Dependency-light on purpose: the page test needs a real browser running the
page's own JavaScript against the real server, not a browser-automation framework.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("CHORUS_CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class ChromiumError(RuntimeError):
    pass


class HeadlessChromium:
    """`async with HeadlessChromium() as browser: page = await browser.open(url)`."""

    def __init__(self, executable: str | None = None, width: int = 1200, height: int = 800) -> None:
        found = executable or find_chromium()
        if found is None:
            raise ChromiumError("chromium not found (install the Debian `chromium` package)")
        self.executable = found
        self.width = width
        self.height = height
        self._profile = tempfile.mkdtemp(prefix="chorus-chromium-")
        self._process: asyncio.subprocess.Process | None = None
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._drainer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HeadlessChromium:
        self._process = await asyncio.create_subprocess_exec(
            self.executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            "--mute-audio",
            f"--user-data-dir={self._profile}",
            f"--window-size={self.width},{self.height}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        url = await self._devtools_url()
        self._ws = await connect(url, max_size=64 * 1024 * 1024)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _devtools_url(self) -> str:
        assert self._process is not None and self._process.stderr is not None
        seen: list[str] = []

        async def scan() -> str:
            assert self._process is not None and self._process.stderr is not None
            while True:
                line = await self._process.stderr.readline()
                if not line:
                    raise ChromiumError("chromium exited: " + " | ".join(seen[-5:]))
                text = line.decode(errors="replace").strip()
                seen.append(text)
                m = re.search(r"DevTools listening on (ws://\S+)", text)
                if m:
                    return m.group(1)

        try:
            url = await asyncio.wait_for(scan(), 30)
        except TimeoutError as exc:
            raise ChromiumError("chromium did not start its DevTools endpoint") from exc
        # keep draining stderr so chromium never blocks on a full pipe
        self._drainer = asyncio.create_task(self._drain_stderr())
        return url

    async def _drain_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        with contextlib.suppress(Exception):
            while await self._process.stderr.readline():
                pass

    async def _read(self) -> None:
        assert self._ws is not None
        async for message in self._ws:
            data = json.loads(message)
            future = self._pending.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        assert self._ws is not None
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self._ws.send(json.dumps(message))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise ChromiumError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def open(self, url: str) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        await page.send("Page.navigate", {"url": url})
        await page.wait_for("document.readyState === 'complete'")
        return page

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self.send("Browser.close")
            with contextlib.suppress(Exception):
                await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), 10)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)


class Page:
    def __init__(self, browser: HeadlessChromium, session: str) -> None:
        self.browser = browser
        self.session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if it is a promise), as JSON."""
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise ChromiumError(f"page raised: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    async def wait_for(self, expression: str, within_s: float = 30.0) -> Any:
        """Poll until `expression` is truthy; its value."""
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise ChromiumError(f"timed out waiting for {expression}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: str | Path) -> Path:
        data = await self.send("Page.captureScreenshot", {"format": "png"})
        out = Path(path)
        await asyncio.to_thread(out.write_bytes, base64.b64decode(data["data"]))
        return out
