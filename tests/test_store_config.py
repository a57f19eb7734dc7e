"""`[store]` in `chorus serve`'s configuration, and the store a URL opens."""

from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from cli.commands.serve import _shown_url
from rooms import InMemoryStore, InProcessLocks, SQLiteStore, open_store
from rooms.postgres import PostgresAdvisoryLocks, PostgresStore
from rooms.store import sqlite_path
from server.config import ConfigError, default_store_url, load_config
from tests.store_fixtures import postgres_url


def test_the_default_store_is_sqlite_in_the_users_data_directory() -> None:
    config = load_config(environ={})
    assert config.store.url is None
    url = config.store.resolved_url()
    assert url == default_store_url()
    assert Path(sqlite_path(url)) == Path(platformdirs.user_data_dir("chorus")) / "chorus.db"


def test_store_url_from_a_file_and_from_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "chorus.toml"
    file.write_text('[store]\nurl = "sqlite:///var/lib/chorus/chorus.db"\n')
    assert load_config(file, environ={}).store.resolved_url() == "sqlite:///var/lib/chorus/chorus.db"
    env = {"CHORUS_STORE_URL": "postgresql://chorus@db/chorus"}
    assert load_config(file, environ=env).store.url == "postgresql://chorus@db/chorus"


@pytest.mark.parametrize("url", ["mysql://x/y", "chorus.db", "redis://h"])
def test_an_unknown_store_url_is_a_clear_error_naming_the_key(url: str) -> None:
    with pytest.raises(ConfigError, match=r"store\.url: .*memory://, sqlite:///"):
        load_config(environ={"CHORUS_STORE_URL": url})


def test_sqlite_urls_name_files() -> None:
    assert sqlite_path("sqlite:///var/lib/chorus/chorus.db") == "/var/lib/chorus/chorus.db"
    assert sqlite_path("sqlite:////var/lib/chorus.db") == "/var/lib/chorus.db"
    assert sqlite_path("sqlite://data/chorus.db") == "data/chorus.db"
    assert sqlite_path("sqlite://:memory:") == ":memory:"
    with pytest.raises(ValueError, match="names a file"):
        sqlite_path("sqlite://")


def test_a_password_never_reaches_the_log() -> None:
    assert _shown_url("postgresql://chorus:s3cret@db:5432/chorus") == "postgresql://chorus:***@db:5432/chorus"
    assert _shown_url("sqlite:///var/lib/chorus.db") == "sqlite:///var/lib/chorus.db"


async def test_open_store_gives_each_store_its_locks(
    tmp_path: Path, postgres_database: str
) -> None:
    memory = await open_store("memory://")
    assert isinstance(memory.store, InMemoryStore) and isinstance(memory.locks, InProcessLocks)
    await memory.close()
    sqlite = await open_store(f"sqlite:///{tmp_path}/new/dir/chorus.db")
    assert isinstance(sqlite.store, SQLiteStore) and isinstance(sqlite.locks, InProcessLocks)
    assert (tmp_path / "new" / "dir" / "chorus.db").exists()
    await sqlite.close()
    url = postgres_url(postgres_database)
    postgres = await open_store(url)
    assert isinstance(postgres.store, PostgresStore)
    assert isinstance(postgres.locks, PostgresAdvisoryLocks)
    await postgres.close()
    with pytest.raises(ValueError, match="unknown store URL"):
        await open_store("mysql://x")
