"""Issue 27.1: the voice directory's storage, on every store (memory, SQLite, Postgres): several
prints per person under one name, each with its embedding model's id, read back by model; a
forgotten voice leaves nothing behind."""

from __future__ import annotations

import pytest

from rooms.voices import MAX_PRINTS_PER_VOICE, VoiceStore, pack_vector, unpack_vector
from tests.store_fixtures import StoreFactory


async def directory(new_store: StoreFactory) -> VoiceStore:
    store = await new_store()
    assert isinstance(store, VoiceStore)
    return store


async def test_prints_under_one_name_are_one_person_with_their_models(
    new_store: StoreFactory,
) -> None:
    store = await directory(new_store)
    first = await store.remember_print("Ian", "campplus-a", pack_vector([1.0, 0.0]), "clip")
    again = await store.remember_print(" Ian ", "campplus-b", pack_vector([0.0, 1.0]), "room:x")
    peggy = await store.remember_print("Peggy", "campplus-a", pack_vector([0.5, 0.5]), "clip")
    assert again.id == first.id != peggy.id
    voices = await store.list_voices()
    assert [v.name for v in voices] == ["Ian", "Peggy"]
    ian = voices[0]
    assert [p.model for p in ian.prints] == ["campplus-a", "campplus-b"]
    assert [p.values for p in ian.prints_of("campplus-b")] == [(0.0, 1.0)]
    assert [p.source for p in ian.prints] == ["clip", "room:x"]
    assert ian.last_heard is None


async def test_forgetting_removes_the_person_and_every_print(new_store: StoreFactory) -> None:
    store = await directory(new_store)
    ian = await store.remember_print("Ian", "m", pack_vector([1.0]), "clip")
    await store.remember_print("Ian", "m", pack_vector([0.9]), "clip")
    assert await store.forget_voice(ian.id)
    assert await store.list_voices() == []
    assert await store.get_voice(ian.id) is None
    assert not await store.forget_voice(ian.id)
    again = await store.remember_print("Ian", "m", pack_vector([1.0]), "clip")
    assert again.id != ian.id and len(again.prints) == 1  # nothing of the old one came back


async def test_last_heard_and_the_print_limit(new_store: StoreFactory) -> None:
    store = await directory(new_store)
    ian = await store.remember_print("Ian", "m", pack_vector([0.0]), "clip")
    await store.voice_heard(ian.id, 1234.5)
    for k in range(MAX_PRINTS_PER_VOICE + 2):
        ian = await store.remember_print("Ian", "m", pack_vector([float(k + 1)]), "clip")
    assert len(ian.prints) == MAX_PRINTS_PER_VOICE
    assert ian.prints[-1].values == (float(MAX_PRINTS_PER_VOICE + 2),)
    assert ian.last_heard == 1234.5


async def test_bad_names_and_vectors_are_refused(new_store: StoreFactory) -> None:
    store = await directory(new_store)
    with pytest.raises(ValueError, match="needs a name"):
        await store.remember_print("  ", "m", pack_vector([1.0]), "clip")
    with pytest.raises(ValueError, match="float32"):
        await store.remember_print("Ian", "m", b"abc", "clip")
    with pytest.raises(ValueError, match="model"):
        await store.remember_print("Ian", "", pack_vector([1.0]), "clip")
    with pytest.raises(ValueError):
        unpack_vector(b"")


async def test_the_generation_moves_with_every_remember_and_forget_only(
    new_store: StoreFactory,
) -> None:
    store = await directory(new_store)
    assert await store.voices_generation() == 0
    ian = await store.remember_print("Ian", "m", pack_vector([1.0]), "clip")
    after_add = await store.voices_generation()
    assert after_add > 0
    await store.voice_heard(ian.id, 1234.5)  # "last heard" names nobody new
    assert await store.voices_generation() == after_add
    assert not await store.forget_voice("voice-nobody")
    assert await store.voices_generation() == after_add
    assert await store.forget_voice(ian.id)
    assert await store.voices_generation() > after_add
