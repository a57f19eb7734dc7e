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

import psycopg


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


def _until_it_answers(
    server: subprocess.Popen[bytes], dsn: str, log: Path, within_s: float = 60.0
) -> None:
    """Wait until the server answers a query (an open port is not enough: a starting server
    refuses connections with "the database system is starting up"), or fail with its log."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Postgres did not start: {log.read_text()}") from None
            time.sleep(0.05)


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields a DSN of a fresh, empty database."""
    base = Path(tempfile.mkdtemp(prefix="chorus-pg-"))
    data, log = base / "data", base / "postgres.log"
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*prefix, _binary("initdb"), "-D", str(data), "-A", "trust", "-U", "chorus", "--no-sync"],
        check=True,
        capture_output=True,
    )
    with log.open("wb") as log_file:  # a file, not a pipe: a pipe nobody reads stalls the server
        for attempt in range(3):  # a free port can be taken by another process before we bind it
            port = _free_port()
            server = subprocess.Popen(
                [*prefix, _binary("postgres"), "-D", str(data), "-p", str(port), "-k", str(base),
                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )  # fmt: skip
            dsn = f"host=127.0.0.1 port={port} user=chorus dbname=postgres"
            try:
                _until_it_answers(server, dsn, log)
                break
            except RuntimeError:
                _stop(server)
                if attempt == 2:
                    shutil.rmtree(base, ignore_errors=True)
                    raise
        try:
            yield dsn
        finally:
            _stop(server)
            shutil.rmtree(base, ignore_errors=True)


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
