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


# --- building from leaves (the log's head, exports' gaps, the offline verifier) -----------------------


def hash_framed_leaves(
    buf: bytearray, view: memoryview, size: int, *, head: int, tail: int, keep: tuple[int, int]
) -> tuple[list[bytes], list[bytearray]]:
    """Leaf hashes of the newline-ended lines in buf[:size], each `head` bytes, the leaf's data, `tail`
    bytes: the data is hashed in place, the byte before it (the last of the head, which the caller no
    longer needs) overwritten with the 0x00 leaf prefix. Also, per line, the bytes from keep[0] before
    its tail to keep[1] past its newline, for the caller to check. IndexError or ValueError where a line
    is shorter than its frame. One loop for a whole block: the verifier's fast pass spends its time here."""
    sha = hashlib.sha256
    find = buf.find
    leaves: list[bytes] = []
    kept: list[bytearray] = []
    leaf, hold = leaves.append, kept.append
    before, after = keep
    s = 0
    while s < size:
        e = find(b"\n", s)
        at = s + head - 1
        buf[at] = 0
        leaf(sha(view[at : e - tail]).digest())
        hold(buf[e - tail - before : e + 1 + after])
        s = e + 1
    return leaves, kept


Visit = Callable[[int, int, bytes], None]  # (level, index, hash) of a subtree a merge completed


class CompactRange:
    """The complete aligned subtrees covering leaves [begin, end), left to right: one hash per node of
    range_nodes(begin, end), O(log n) memory (transparency-dev's compact range). From begin 0 it is the
    right edge of a growing tree and its root is the tree's root (the log head, the verifier); from
    elsewhere it is a run of leaves an export leaves out, written as gap records. The one implementation
    of merging subtrees into a range: the head, exports and both verifier passes use it.
    """

    __slots__ = ("_hashes", "_levels", "begin", "end")

    def __init__(self, begin: int = 0, end: int | None = None, hashes: Sequence[bytes] = ()) -> None:
        self.begin = begin
        self.end = begin if end is None else end
        self._levels = [level for level, _index in range_nodes(begin, self.end)]
        if len(hashes) != len(self._levels):
            raise ProofError(f"the range [{begin}, {self.end}) has {len(self._levels)} subtrees, not {len(hashes)}")
        self._hashes = list(hashes)

    @property
    def size(self) -> int:
        """How many leaves the range covers."""
        return self.end - self.begin

    @property
    def hashes(self) -> list[bytes]:
        return list(self._hashes)

    def copy(self) -> CompactRange:
        twin = CompactRange(self.begin)
        twin.end, twin._levels, twin._hashes = self.end, list(self._levels), list(self._hashes)
        return twin

    def append_leaf_hash(self, leaf: bytes, visit: Visit | None = None) -> None:
        self.append_node(0, leaf, visit)

    def append_node(self, level: int, node: bytes, visit: Visit | None = None) -> None:
        """Append the complete subtree of `level` that starts at `end`; ProofError if it is not aligned
        there. Each subtree that the merge completes is passed to `visit` (the log stores them)."""
        at = self.end
        if at & ((1 << level) - 1):
            raise ProofError(f"a subtree of level {level} cannot start at leaf {at}")
        levels, hashes = self._levels, self._hashes
        self.end = at + (1 << level)
        # The last subtree is the left sibling exactly when it has this level and `node` is a right child.
        while levels and levels[-1] == level and (at >> level) & 1:
            levels.pop()
            node = hash_children(hashes.pop(), node)
            at -= 1 << level
            level += 1
            if visit is not None:
                visit(level, at >> level, node)
        levels.append(level)
        hashes.append(node)

    def extend_leaves(self, leaves: Sequence[bytes]) -> None:
        """Append many leaf hashes at once: each aligned subtree of the new leaves is reduced a level at a
        time (no call per leaf), then appended as one node."""
        sha = hashlib.sha256
        offset = 0
        for level, _index in range_nodes(self.end, self.end + len(leaves)):
            width = 1 << level
            nodes = leaves[offset : offset + width]
            while len(nodes) > 1:
                pairs = iter(nodes)
                nodes = [sha(b"\x01" + left + right).digest() for left, right in zip(pairs, pairs, strict=True)]
            self.append_node(level, nodes[0])
            offset += width

    def nodes(self) -> list[tuple[int, int, bytes]]:
        """(level, first leaf, hash) of each subtree, left to right."""
        out, start = [], self.begin
        for level, node in zip(self._levels, self._hashes, strict=True):
            out.append((level, start, node))
            start += 1 << level
        return out

    def restart(self, at: int) -> list[tuple[int, int, bytes]]:
        """The subtrees so far (as nodes()), leaving an empty range that starts at `at`."""
        out = self.nodes()
        self.begin = self.end = at
        self._levels, self._hashes = [], []
        return out

    def root(self) -> bytes:
        """RFC 6962 root of the tree of `end` leaves; only a range from leaf 0 has one."""
        if self.begin:
            raise ProofError(f"a range starting at leaf {self.begin} is not a whole tree")
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
