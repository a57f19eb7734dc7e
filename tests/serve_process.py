"""`chorus serve` as a real process, for tests that restart it or run two on one store.

Started on a free port with `--config`, the server secret from the harness (or none: a loopback
server then makes one and prints it, read into `secret`), and the store the config file names
(the test environment's `CHORUS_STORE_URL` is dropped); `stop()` sends SIGTERM and expects the
drain to end with exit code 0.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from server.testing.harness import SECRET

REPO = Path(__file__).resolve().parents[1]


class ServeExited(AssertionError):
    """`chorus serve` ended before it listened: its exit status and the lines it printed."""

    def __init__(self, returncode: int, lines: list[str]) -> None:
        super().__init__(f"chorus serve exited ({returncode}):\n" + "".join(lines))
        self.returncode = returncode
        self.lines = lines


class ServeProcess:
    def __init__(self, proc: asyncio.subprocess.Process, port: int, secret: str | None,
                 lines: list[str]) -> None:
        self.proc = proc
        self.port = port
        self.base = f"ws://127.0.0.1:{port}"
        self.secret = secret
        self.lines = lines
        """What the process printed up to "listening on"."""

    @classmethod
    async def start(cls, config: Path, site: Path | None = None,
                    secret: str | None = SECRET,
                    env: dict[str, str] | None = None) -> ServeProcess:
        """`site`: a directory put first on the process's PYTHONPATH (a `sitecustomize.py`);
        `secret=None`: no `CHORUS_SECRET` (the file's, or the server makes one, read from its
        output); `env`: more variables for the process."""
        env = {**os.environ, **(env or {}), "CHORUS_SECRET": secret or ""}
        if secret is None:
            env.pop("CHORUS_SECRET")
        if site is not None:
            env["PYTHONPATH"] = f"{site}{os.pathsep}{REPO}"
        env.pop("CHORUS_STORE_URL", None)  # the config file names the store
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli.main", "serve", "--port", "0", "--config", str(config),
            cwd=REPO, env=env, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stderr is not None
        lines: list[str] = []
        async with asyncio.timeout(90):
            while True:
                line = (await proc.stderr.readline()).decode()
                if not line:
                    raise ServeExited(await proc.wait(), lines)
                lines.append(line)
                if m := re.search(r"CHORUS_SECRET=(\S+)", line):
                    secret = m.group(1)
                if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line):
                    return cls(proc, int(m.group(1)), secret, lines)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                assert await self.proc.wait() == 0
