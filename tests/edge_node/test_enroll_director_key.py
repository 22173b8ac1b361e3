"""The director key a node gets at enrollment: parsed strictly before it is trusted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner

from edge_node.enroll import EnrollmentFiles, parse_director_key
from edge_node.errors import InvalidInputError, StorageError


def key_json(signer: CryptoSigner, **changes: Any) -> bytes:
    data = {"keyid": signer.public_key.keyid, **signer.public_key.to_dict(), **changes}
    return json.dumps(data, sort_keys=True).encode()


def test_the_director_key_is_read_back_as_the_signers_public_key() -> None:
    signer = CryptoSigner.generate_ed25519()
    assert parse_director_key(key_json(signer)) == signer.public_key


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"keytype": "ed25519"}',
        b"{" + b" " * 5000 + b"}",
    ],
)
def test_garbage_is_not_a_director_key(data: bytes) -> None:
    with pytest.raises(InvalidInputError):
        parse_director_key(data)


def test_a_keyid_that_is_not_the_keys_hash_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="canonical JSON"):
        parse_director_key(key_json(CryptoSigner.generate_ed25519(), keyid="ab" * 32))


def test_only_ed25519_is_a_director_key() -> None:
    with pytest.raises(InvalidInputError, match="only Ed25519"):
        parse_director_key(key_json(CryptoSigner.generate_ecdsa()))


def test_a_node_without_the_file_has_no_usable_director_key(tmp_path: Path) -> None:
    files = EnrollmentFiles(directory=tmp_path, node_id="n-1", fleet="gates")
    with pytest.raises(StorageError):
        files.director_key()
    files.director_key_path.write_bytes(b"{}")
    with pytest.raises(StorageError):
        files.director_key()
