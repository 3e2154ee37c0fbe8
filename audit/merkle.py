"""RFC 6962 Merkle tree hashing, proofs and their verification; pure functions, no storage.

Hashes are raw 32-byte SHA-256 digests. A tree of size n is the RFC 6962 tree over leaves 0..n-1:
its root folds the complete, aligned subtrees of the binary decomposition of n from right to left.
A complete subtree is named by (level, index): it covers leaves [index * 2**level, (index + 1) * 2**level).

Verification follows transparency-dev/merkle (proof/verify.go) so the published vectors apply as is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from audit.errors import ProofError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

Node = tuple[int, int]  # (level, index) of a complete subtree


def hash_leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def hash_children(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _largest_power_of_two_below(n: int) -> int:
    """The k of RFC 6962: the largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def range_nodes(start: int, end: int) -> list[Node]:
    """The complete aligned subtrees covering [start, end), left to right (a "compact range")."""
    if not 0 <= start <= end:
        raise ValueError(f"bad range [{start}, {end})")
    nodes: list[Node] = []
    while start < end:
        # The largest aligned block that starts at `start` and fits in the range.
        level = (start & -start).bit_length() - 1 if start else (end - start).bit_length() - 1
        while (1 << level) > end - start:
            level -= 1
        nodes.append((level, start >> level))
        start += 1 << level
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """Root of the subtrees of a decomposition, folded right to left (RFC 6962 MTH)."""
    if not hashes:
        return EMPTY_ROOT
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = hash_children(h, acc)
    return acc


def _subtree_ranges_inclusion(index: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """RFC 6962 PATH(m, D[lo:hi]) as the ranges whose MTH are the proof hashes, leaf to root."""
    out: list[tuple[int, int]] = []
    while hi - lo > 1:
        k = _largest_power_of_two_below(hi - lo)
        if index < lo + k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            lo = lo + k
    out.reverse()
    return out


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """Ranges [a, b) whose subtree hashes form the inclusion proof of leaf `index` in a tree of `size`."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not in a tree of size {size}")
    return _subtree_ranges_inclusion(index, 0, size)


def consistency_ranges(size1: int, size2: int) -> list[tuple[int, int]]:
    """Ranges whose subtree hashes form the RFC 6962 consistency proof from size1 to size2."""
    if not 0 <= size1 <= size2:
        raise ProofError(f"cannot prove consistency from size {size1} to size {size2}")
    if size1 == 0 or size1 == size2:
        return []
    out: list[tuple[int, int]] = []
    m, lo, hi, whole = size1, 0, size2, True
    while True:
        n = hi - lo
        if m == n:
            if not whole:
                out.append((lo, hi))
            break
        k = _largest_power_of_two_below(n)
        if m <= k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            m -= k
            lo = lo + k
            whole = False
    out.reverse()
    return out


def subtree_hash(start: int, end: int, node_hash: Callable[[Node], bytes]) -> bytes:
    """MTH(D[start:end]) of a range that is a subtree of some tree, from its aligned parts."""
    return fold([node_hash(n) for n in range_nodes(start, end)])


def nodes_for_ranges(ranges: Iterable[tuple[int, int]]) -> set[Node]:
    needed: set[Node] = set()
    for a, b in ranges:
        needed.update(range_nodes(a, b))
    return needed


# --- building from leaves (tests, exports, the offline verifier) --------------------------------


class CompactRange:
    """The right edge of a growing tree: one hash per set bit of its size; O(log n) memory.

    `append_node` takes an aligned complete subtree (level, hash) that starts exactly at `size`.
    """

    __slots__ = ("_hashes", "_levels", "size")

    def __init__(self) -> None:
        self.size = 0
        self._levels: list[int] = []
        self._hashes: list[bytes] = []

    def append_leaf_hash(self, leaf: bytes) -> None:
        self.append_node(0, leaf)

    def append_node(self, level: int, node: bytes) -> None:
        if self.size & ((1 << level) - 1):
            raise ProofError(f"a subtree of level {level} cannot start at leaf {self.size}")
        levels, hashes = self._levels, self._hashes
        if levels and levels[-1] < level:
            raise ProofError(f"a subtree of level {level} cannot follow one of level {levels[-1]}")
        self.size += 1 << level
        while levels and levels[-1] == level:
            levels.pop()
            node = hash_children(hashes.pop(), node)
            level += 1
        levels.append(level)
        hashes.append(node)

    def root(self) -> bytes:
        return fold(self._hashes)


def root_from_leaf_hashes(leaves: Sequence[bytes]) -> bytes:
    cr = CompactRange()
    for leaf in leaves:
        cr.append_leaf_hash(leaf)
    return cr.root()


def _mth(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    return fold([_complete(leaves, lv, i) for lv, i in range_nodes(lo, hi)])


def _complete(leaves: Sequence[bytes], level: int, index: int) -> bytes:
    if level == 0:
        return leaves[index]
    return hash_children(_complete(leaves, level - 1, 2 * index), _complete(leaves, level - 1, 2 * index + 1))


def inclusion_proof_from_leaves(leaves: Sequence[bytes], index: int, size: int) -> list[bytes]:
    return [_mth(leaves, a, b) for a, b in inclusion_ranges(index, size)]


def consistency_proof_from_leaves(leaves: Sequence[bytes], size1: int, size2: int) -> list[bytes]:
    return [_mth(leaves, a, b) for a, b in consistency_ranges(size1, size2)]


# --- verification (transparency-dev/merkle proof/verify.go) -------------------------------------


def _decomp_inclusion(index: int, size: int) -> tuple[int, int]:
    inner = (index ^ (size - 1)).bit_length()
    border = bin(index >> inner).count("1")
    return inner, border


def _chain_inner(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, h in enumerate(proof):
        seed = hash_children(seed, h) if (index >> i) & 1 == 0 else hash_children(h, seed)
    return seed


def _chain_inner_right(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, h in enumerate(proof):
        if (index >> i) & 1 == 1:
            seed = hash_children(h, seed)
    return seed


def _chain_border_right(seed: bytes, proof: Sequence[bytes]) -> bytes:
    for h in proof:
        seed = hash_children(h, seed)
    return seed


def _check_hashes(proof: Sequence[bytes]) -> None:
    for i, h in enumerate(proof):
        if len(h) != HASH_SIZE:
            raise ProofError(f"proof hash {i} is {len(h)} bytes, want {HASH_SIZE}")


def root_from_inclusion_proof(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is beyond the tree size {size}")
    if len(leaf) != HASH_SIZE:
        raise ProofError(f"leaf hash is {len(leaf)} bytes, want {HASH_SIZE}")
    _check_hashes(proof)
    inner, border = _decomp_inclusion(index, size)
    if len(proof) != inner + border:
        raise ProofError(f"inclusion proof has {len(proof)} hashes, want {inner + border}")
    res = _chain_inner(leaf, proof[:inner], index)
    return _chain_border_right(res, proof[inner:])


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Returns if leaf `index` with hash `leaf` is in the tree of `size` with `root`; else ProofError."""
    calc = root_from_inclusion_proof(index, size, leaf, proof)
    if calc != root:
        raise ProofError(f"inclusion proof of leaf {index} leads to root {calc.hex()}, not {root.hex()}")


def verify_consistency(size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]) -> None:
    """Returns if the tree (size1, root1) is a prefix of (size2, root2); else ProofError."""
    if size2 < size1:
        raise ProofError(f"size2 ({size2}) < size1 ({size1})")
    if size1 == size2:
        if proof:
            raise ProofError("sizes are equal but the consistency proof is not empty")
        if root1 != root2:
            raise ProofError("sizes are equal but the roots differ")
        if size1 == 0 and root1 != EMPTY_ROOT:
            raise ProofError("the root of an empty tree must be SHA-256 of nothing")
        return
    if size1 == 0:
        raise ProofError("consistency with an empty tree proves nothing; refusing it")
    if not proof:
        raise ProofError("empty consistency proof for different sizes")
    _check_hashes(proof)
    inner, border = _decomp_inclusion(size1 - 1, size2)
    shift = (size1 & -size1).bit_length() - 1
    inner -= shift
    if size1 == 1 << shift:
        seed, start = root1, 0
    else:
        seed, start = proof[0], 1
    if len(proof) != start + inner + border:
        raise ProofError(f"consistency proof has {len(proof)} hashes, want {start + inner + border}")
    rest = proof[start:]
    mask = (size1 - 1) >> shift
    hash1 = _chain_border_right(_chain_inner_right(seed, rest[:inner], mask), rest[inner:])
    if hash1 != root1:
        raise ProofError(f"consistency proof does not lead to the old root {root1.hex()}")
    hash2 = _chain_border_right(_chain_inner(seed, rest[:inner], mask), rest[inner:])
    if hash2 != root2:
        raise ProofError(f"consistency proof does not lead to the new root {root2.hex()}")
