"""The ArtifactStore contract: every test here runs on the local store and on S3 (moto)."""

from __future__ import annotations

import itertools
import urllib.request
from collections.abc import Iterator

import pytest

from control_plane.artifacts import ArtifactStore
from control_plane.errors import (
    ArtifactIntegrityError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
)
from tests.control_plane.artifacts._support import (
    BigArtifact,
    StoreKit,
    chunked,
    random_bytes,
    read_all,
    sha,
)

DATA = random_bytes(300_000)
DATA_SHA = sha(DATA)
BIG = BigArtifact()
MISSING_SHA = "0" * 64


class ClientCutOff(ConnectionResetError):
    """What a request body iterator raises when the uploader disappears."""


def cut_off_after(data: bytes, keep: int, size: int = 64 * 1024) -> Iterator[bytes]:
    yield from chunked(data[:keep], size)
    raise ClientCutOff("client went away")


def untouchable() -> Iterator[bytes]:
    raise AssertionError("the store read a stream it should have refused")
    yield b""  # pragma: no cover - makes this a generator


# -- round trips ----------------------------------------------------------------------------------


def test_round_trip(store: ArtifactStore) -> None:
    assert store.put(DATA_SHA, len(DATA), chunked(DATA)) is True
    assert store.exists(DATA_SHA)
    assert store.size(DATA_SHA) == len(DATA)
    assert read_all(store.open_range(DATA_SHA)) == DATA


def test_accepts_a_list_and_empty_chunks(store: ArtifactStore) -> None:
    assert store.put(DATA_SHA, len(DATA), [b"", DATA[:10], b"", DATA[10:], b""])
    assert read_all(store.open_range(DATA_SHA)) == DATA


def test_empty_artifact(store: ArtifactStore) -> None:
    empty_sha = sha(b"")
    assert store.put(empty_sha, 0, []) is True
    assert store.size(empty_sha) == 0
    assert read_all(store.open_range(empty_sha)) == b""


def test_artifact_bigger_than_a_part_round_trips(store_kit: StoreKit, store: ArtifactStore) -> None:
    assert store.put(BIG.sha256, BIG.length, BIG.chunks()) is True
    assert store.size(BIG.sha256) == BIG.length
    digest_of_read = sha(read_all(store.open_range(BIG.sha256)))
    assert digest_of_read == BIG.sha256
    # a range across the 5 MiB part boundary (S3) and chunk boundaries
    start, end = 5 * (1 << 20) - 1000, 5 * (1 << 20) + 3000
    assert read_all(store.open_range(BIG.sha256, start, end)) == BIG.slice(start, end)
    assert store_kit.leftovers() == [_only_object(store_kit, BIG.sha256)]


def test_reput_of_existing_artifact_returns_false_and_keeps_it(
    store_kit: StoreKit, store: ArtifactStore
) -> None:
    assert store.put(DATA_SHA, len(DATA), chunked(DATA)) is True
    before = store_kit.leftovers()
    pulled: list[bytes] = []

    def recording() -> Iterator[bytes]:
        for chunk in chunked(DATA):
            pulled.append(chunk)
            yield chunk

    assert store.put(DATA_SHA, len(DATA), recording()) is False
    assert b"".join(pulled) == DATA  # the stream was still read (proof of possession)
    assert store_kit.leftovers() == before
    assert read_all(store.open_range(DATA_SHA)) == DATA


def test_reput_of_existing_artifact_with_wrong_bytes_is_refused(store: ArtifactStore) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    forged = bytes(len(DATA))
    with pytest.raises(ArtifactIntegrityError):
        store.put(DATA_SHA, len(forged), chunked(forged))
    assert read_all(store.open_range(DATA_SHA)) == DATA


# -- ranges ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (0, None),
        (0, 1),
        (0, 100),
        (1234, 5678),
        (len(DATA) - 1, None),
        (len(DATA) - 10, len(DATA)),
        (100, None),
        (len(DATA), None),
        (len(DATA), len(DATA)),
        (777, 777),
        (0, 0),
    ],
)
def test_range(store: ArtifactStore, start: int, end: int | None) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    assert read_all(store.open_range(DATA_SHA, start, end)) == DATA[start:end]


@pytest.mark.parametrize(
    ("start", "end"),
    [(-1, None), (0, len(DATA) + 1), (10, 9), (len(DATA) + 1, None), (-5, -1)],
)
def test_range_out_of_bounds_is_refused_at_call_time(
    store: ArtifactStore, start: int, end: int | None
) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    with pytest.raises(InvalidInputError):
        store.open_range(DATA_SHA, start, end)  # no iteration needed: checked eagerly


def test_range_honours_chunk_size(store: ArtifactStore) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    chunks = list(store.open_range(DATA_SHA, 10, 100_010, chunk_size=4096))
    assert all(0 < len(c) <= 4096 for c in chunks)
    assert b"".join(chunks) == DATA[10:100_010]


@pytest.mark.parametrize("chunk_size", [0, -1, (8 << 20) + 1])
def test_range_refuses_bad_chunk_size(store: ArtifactStore, chunk_size: int) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    with pytest.raises(InvalidInputError):
        store.open_range(DATA_SHA, chunk_size=chunk_size)


def test_range_of_missing_artifact_is_not_found_at_call_time(store: ArtifactStore) -> None:
    with pytest.raises(NotFoundError):
        store.open_range(MISSING_SHA)


def test_closing_a_range_early_releases_it(store: ArtifactStore) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    stream = store.open_range(DATA_SHA, chunk_size=1000)
    assert next(stream) == DATA[:1000]
    stream.close()
    store.delete(DATA_SHA)  # nothing holds the artifact open
    assert not store.exists(DATA_SHA)


# -- exists / size / delete -----------------------------------------------------------------------


def test_missing_artifact(store: ArtifactStore) -> None:
    assert store.exists(MISSING_SHA) is False
    assert store.size(MISSING_SHA) is None


def test_delete_is_idempotent(store_kit: StoreKit, store: ArtifactStore) -> None:
    store.delete(MISSING_SHA)
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    store.delete(DATA_SHA)
    store.delete(DATA_SHA)
    assert not store.exists(DATA_SHA)
    assert store.size(DATA_SHA) is None
    with pytest.raises(NotFoundError):
        store.open_range(DATA_SHA)
    assert store_kit.leftovers() == []
    assert store.put(DATA_SHA, len(DATA), chunked(DATA)) is True  # can be stored again


# -- refused uploads leave nothing behind ---------------------------------------------------------


@pytest.mark.parametrize("big", [False, True], ids=["small", "multipart"])
def test_wrong_hash_is_refused_and_leaves_nothing(
    store_kit: StoreKit, store: ArtifactStore, big: bool
) -> None:
    length, chunks = (BIG.length, BIG.chunks()) if big else (len(DATA), chunked(DATA))
    claimed = "ab" * 32
    with pytest.raises(ArtifactIntegrityError) as caught:
        store.put(claimed, length, chunks)
    fields = caught.value.fields
    assert fields["expected_sha256"] == claimed
    assert fields["actual_sha256"] == (BIG.sha256 if big else DATA_SHA)
    assert fields["expected_length"] == fields["actual_length"] == length
    assert not store.exists(claimed)
    assert store_kit.leftovers() == []


def test_short_stream_is_refused_and_leaves_nothing(
    store_kit: StoreKit, store: ArtifactStore
) -> None:
    with pytest.raises(ArtifactIntegrityError) as caught:
        store.put(DATA_SHA, len(DATA) + 1, chunked(DATA))
    assert caught.value.fields["expected_length"] == len(DATA) + 1
    assert caught.value.fields["actual_length"] == len(DATA)
    assert not store.exists(DATA_SHA)
    assert store_kit.leftovers() == []


def test_long_stream_is_refused_and_leaves_nothing(
    store_kit: StoreKit, store: ArtifactStore
) -> None:
    with pytest.raises(ArtifactIntegrityError) as caught:
        store.put(DATA_SHA, len(DATA) - 1, chunked(DATA))
    assert caught.value.fields["expected_length"] == len(DATA) - 1
    assert not store.exists(DATA_SHA)
    assert store_kit.leftovers() == []


def test_reading_stops_as_soon_as_the_stream_is_too_long(
    store_kit: StoreKit, store: ArtifactStore
) -> None:
    pulled = 0

    def endless() -> Iterator[bytes]:
        nonlocal pulled
        for chunk in itertools.repeat(b"x" * 1000):
            pulled += 1
            yield chunk

    with pytest.raises(ArtifactIntegrityError):
        store.put(DATA_SHA, 5_500, endless())
    assert pulled == 6  # the sixth chunk crossed the declared length; no seventh was read
    assert store_kit.leftovers() == []


@pytest.mark.parametrize("big", [False, True], ids=["small", "multipart"])
def test_upload_cut_off_mid_stream_reraises_and_leaves_nothing(
    store_kit: StoreKit, store: ArtifactStore, big: bool
) -> None:
    data = BIG.slice(0, BIG.length) if big else DATA
    # past the first 5 MiB part for the S3 multipart case, so a part was really uploaded
    keep = 7 * (1 << 20) if big else len(DATA) // 2
    with pytest.raises(ClientCutOff):  # the caller's own error, not wrapped
        store.put(sha(data), len(data), cut_off_after(data, keep))
    assert not store.exists(sha(data))
    assert store_kit.leftovers() == []  # no object, no temp file, no pending multipart upload


def test_over_max_length_is_refused_before_reading(store_kit: StoreKit) -> None:
    store = store_kit.make(max_length=1000)
    with pytest.raises(PayloadTooLargeError) as caught:
        store.put(DATA_SHA, 1001, untouchable())
    assert caught.value.fields["max_length"] == 1000
    small = DATA[:1000]
    assert store.put(sha(small), 1000, chunked(small)) is True  # the limit itself is allowed
    assert store_kit.leftovers() == [_only_object(store_kit, sha(small))]


# -- argument validation --------------------------------------------------------------------------

BAD_SHAS = ["", "abc", "A" * 64, "g" * 64, "0" * 63, "0" * 65, " " + "0" * 63, "../" + "0" * 61]


@pytest.mark.parametrize("bad", BAD_SHAS)
def test_invalid_sha256_is_refused_everywhere(store: ArtifactStore, bad: str) -> None:
    with pytest.raises(InvalidInputError):
        store.put(bad, 1, untouchable())
    with pytest.raises(InvalidInputError):
        store.open_range(bad)
    with pytest.raises(InvalidInputError):
        store.size(bad)
    with pytest.raises(InvalidInputError):
        store.exists(bad)
    with pytest.raises(InvalidInputError):
        store.delete(bad)
    with pytest.raises(InvalidInputError):
        store.download_url(bad)


@pytest.mark.parametrize("length", [-1, True])
def test_invalid_length_is_refused(store: ArtifactStore, length: int) -> None:
    with pytest.raises(InvalidInputError):
        store.put(DATA_SHA, length, untouchable())


@pytest.mark.parametrize("expires_s", [0, -1, 7 * 24 * 3600 + 1])
def test_invalid_url_expiry_is_refused(store: ArtifactStore, expires_s: int) -> None:
    with pytest.raises(InvalidInputError):
        store.download_url(DATA_SHA, expires_s)


def test_download_url_is_none_or_serves_the_bytes(store: ArtifactStore) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    url = store.download_url(DATA_SHA, expires_s=60)
    if url is not None:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.read() == DATA


def _only_object(store_kit: StoreKit, sha256: str) -> str:
    if store_kit.kind == "local":
        return f"sha256/{sha256[:2]}/{sha256[2:4]}/{sha256}"
    return f"object:artifacts/sha256/{sha256}"


def test_artifact_deleted_between_open_and_read_is_not_found(store: ArtifactStore) -> None:
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    stream = store.open_range(DATA_SHA)  # existence checked here...
    store.delete(DATA_SHA)
    with pytest.raises(NotFoundError):  # ...and the race reported, not a truncated read
        next(stream)
