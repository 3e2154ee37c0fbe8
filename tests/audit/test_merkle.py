"""RFC 6962 hashing and proofs: the transparency-dev vectors, then properties with hypothesis."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit import merkle
from audit.errors import ProofError
from tests.conftest import SHARED_TESTDATA

VECTORS = SHARED_TESTDATA / "merkle"
needs_vectors = pytest.mark.skipif(not VECTORS.is_dir(), reason=f"transparency-dev vectors not present at {VECTORS}")


def _b64(value: str | None) -> bytes:
    return base64.b64decode(value or "")


def _cases(kind: str) -> list[Path]:
    return sorted((VECTORS / kind).rglob("*.json")) if VECTORS.is_dir() else []


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(VECTORS)) for p in paths]


@needs_vectors
def test_vector_folders_are_all_found() -> None:
    inclusion, consistency = _cases("inclusion"), _cases("consistency")
    assert len(inclusion) > 50 and len(consistency) > 50
    assert sum(not json.loads(p.read_text())["wantErr"] for p in inclusion + consistency) >= 10


@needs_vectors
def test_leaves_and_roots() -> None:
    data = json.loads((VECTORS / "leaves_and_roots.json").read_text())
    leaves = [merkle.hash_leaf(bytes.fromhex(x)) for x in data["leaf_inputs_hex"]]
    for size, root in enumerate(data["root_hashes_hex_by_size"]):
        assert merkle.root_from_leaf_hashes(leaves[:size]).hex() == root
    # our own proof builder reproduces every happy-path proof of the vectors
    for path in _cases("inclusion"):
        v = json.loads(path.read_text())
        if not v["wantErr"] and v["treeSize"] <= 8 and path.parent.name != "single-entry":
            assert merkle.inclusion_proof_from_leaves(leaves, v["leafIdx"], v["treeSize"]) == [
                _b64(h) for h in v["proof"] or []
            ]
    for path in _cases("consistency"):
        v = json.loads(path.read_text())
        if not v["wantErr"] and v["size2"] <= 8 and v["root1"] != "ZG9uJ3QgY2FyZSAy":
            assert merkle.consistency_proof_from_leaves(leaves, v["size1"], v["size2"]) == [
                _b64(h) for h in v["proof"] or []
            ]


@needs_vectors
@pytest.mark.parametrize("path", _cases("inclusion"), ids=_ids(_cases("inclusion")))
def test_inclusion_vector(path: Path) -> None:
    v = json.loads(path.read_text())
    args = (v["leafIdx"], v["treeSize"], _b64(v["leafHash"]), [_b64(h) for h in v["proof"] or []], _b64(v["root"]))
    if v["wantErr"]:
        with pytest.raises(ProofError):
            merkle.verify_inclusion(*args)
    else:
        merkle.verify_inclusion(*args)


@needs_vectors
@pytest.mark.parametrize("path", _cases("consistency"), ids=_ids(_cases("consistency")))
def test_consistency_vector(path: Path) -> None:
    v = json.loads(path.read_text())
    args = (v["size1"], v["size2"], _b64(v["root1"]), _b64(v["root2"]), [_b64(h) for h in v["proof"] or []])
    if v["wantErr"]:
        with pytest.raises(ProofError):
            merkle.verify_consistency(*args)
    else:
        merkle.verify_consistency(*args)


def _leaves(n: int) -> list[bytes]:
    return [merkle.hash_leaf(i.to_bytes(4, "big")) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_inclusion_proofs_verify_and_any_change_is_rejected(data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 300))
    index = data.draw(st.integers(0, size - 1))
    leaves = _leaves(size)
    root = merkle.root_from_leaf_hashes(leaves)
    proof = merkle.inclusion_proof_from_leaves(leaves, index, size)
    merkle.verify_inclusion(index, size, leaves[index], proof, root)
    if proof:
        k = data.draw(st.integers(0, len(proof) - 1))
        bad = [*proof]
        bad[k] = bytes([bad[k][0] ^ 1]) + bad[k][1:]
        with pytest.raises(ProofError):
            merkle.verify_inclusion(index, size, leaves[index], bad, root)
    with pytest.raises(ProofError):
        merkle.verify_inclusion(index, size, merkle.hash_leaf(b"other"), proof, root)
    other = data.draw(st.integers(0, size - 1))
    if other != index:
        with pytest.raises(ProofError):
            merkle.verify_inclusion(other, size, leaves[index], proof, root)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_consistency_proofs_verify_and_forks_are_rejected(data: st.DataObject) -> None:
    size2 = data.draw(st.integers(1, 300))
    size1 = data.draw(st.integers(1, size2))
    leaves = _leaves(size2)
    root1 = merkle.root_from_leaf_hashes(leaves[:size1])
    root2 = merkle.root_from_leaf_hashes(leaves)
    proof = merkle.consistency_proof_from_leaves(leaves, size1, size2)
    merkle.verify_consistency(size1, size2, root1, root2, proof)
    # a history rewritten inside the old prefix is not consistent
    forked = [*leaves]
    j = data.draw(st.integers(0, size1 - 1))
    forked[j] = merkle.hash_leaf(b"rewritten")
    fork_root2 = merkle.root_from_leaf_hashes(forked)
    with pytest.raises(ProofError):
        fork_proof = merkle.consistency_proof_from_leaves(forked, size1, size2)
        merkle.verify_consistency(size1, size2, root1, fork_root2, fork_proof)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**20), st.integers(0, 2**20))
def test_range_nodes_cover_exactly_with_aligned_subtrees(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    pos = lo
    for level, index in merkle.range_nodes(lo, hi):
        assert index << level == pos
        pos += 1 << level
    assert pos == hi
    assert len(merkle.range_nodes(lo, hi)) <= 2 * 21


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 200), st.data())
def test_compact_range_from_aligned_pieces_gives_the_same_root(size: int, data: st.DataObject) -> None:
    leaves = _leaves(size)
    cut = sorted(set(data.draw(st.lists(st.integers(0, size), max_size=6))) | {0, size})
    cr = merkle.CompactRange()
    for lo, hi in itertools.pairwise(cut):
        for level, index in merkle.range_nodes(lo, hi):
            start = index << level
            node = merkle.root_from_leaf_hashes(leaves[start : start + (1 << level)])
            cr.append_node(level, node)
    assert cr.size == size
    assert cr.root() == merkle.root_from_leaf_hashes(leaves)


def test_misaligned_piece_is_refused() -> None:
    cr = merkle.CompactRange()
    cr.append_leaf_hash(merkle.hash_leaf(b"a"))
    with pytest.raises(ProofError):
        cr.append_node(1, merkle.hash_leaf(b"b"))


def test_empty_tree_root_is_sha256_of_nothing() -> None:
    assert merkle.root_from_leaf_hashes([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
