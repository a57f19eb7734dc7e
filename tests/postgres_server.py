"""A throwaway Postgres server for tests: `initdb` in a temporary directory, a free port on
127.0.0.1, stopped at the end. Runs the server as the `postgres` system user when the tests run
as root (Postgres refuses to run as root)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise RuntimeError(f"Postgres binary {name!r} not found (install Debian's postgresql package)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields a DSN of a fresh, empty database."""
    base = Path(tempfile.mkdtemp(prefix="chorus-pg-"))
    data = base / "data"
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    subprocess.run(
        [*prefix, _binary("initdb"), "-D", str(data), "-A", "trust", "-U", "chorus", "--no-sync"],
        check=True,
        capture_output=True,
    )
    server = subprocess.Popen(
        [*prefix, _binary("postgres"), "-D", str(data), "-p", str(port), "-k", str(base),
         "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    dsn = f"host=127.0.0.1 port={port} user=chorus dbname=postgres"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    err = server.stderr.read().decode() if server.stderr else ""
                    raise RuntimeError(f"Postgres did not start: {err}") from None
                time.sleep(0.05)
        time.sleep(0.2)
        yield dsn
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(base, ignore_errors=True)
