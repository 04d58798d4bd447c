"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, prefix caching, LRU eviction.

Every block is in exactly one of three states:
- in use: ref_count > 0 (held by one or more running sequences, shared when a prefix is cached);
- cached: ref_count == 0 but still reachable by its prefix hash, kept in an LRU list until reused;
- free: ref_count == 0 and unreachable.
Allocation takes free blocks first, then evicts the least recently used cached one.

A full, computed block is keyed by a keyed hash of (parent block's hash, its token ids). The key is secret
per process (or given in the config), so one tenant cannot predict another's hashes. A lookup hit is only
trusted after comparing the stored token ids and the identity of the parent's content, so even a forced hash
collision can never serve another prompt's KV.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from reference_engine.sequence import Sequence


class BlockAccountingError(RuntimeError):
    """The block bookkeeping broke an invariant (a leak, a double free, a negative reference count)."""


def block_hash(key: bytes, parent_hash: bytes | None, token_ids: SequenceABC[int]) -> bytes:
    """Keyed hash of one full block chained to its parent. Blocks are always full, so the input length
    alone tells a root block (no parent) from a child one."""
    h = _keyed(key).copy()  # keying blake2b costs a compression: done once per key, copied per block
    if parent_hash is not None:
        h.update(parent_hash)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


_block_hash = block_hash


def block_hash_replaced() -> bool:
    """Whether `block_hash` has been replaced (tests force collisions through it): a cheaper hash a subclass
    keys blocks by must then step aside, so the replacement sees every block."""
    return block_hash is not _block_hash


@lru_cache(maxsize=64)
def _keyed(key: bytes) -> Any:
    return hashlib.blake2b(key=key, digest_size=16)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | int | None = None  # int: a simulator's unkeyed hash (reference_engine.private_blocks)
    token_ids: tuple[int, ...] | None = None
    # Identity of the prefix content this block holds (0 = none). Equal ids mean equal whole prefixes; new
    # ids are never reused, so a child cannot be matched under a parent whose content was replaced.
    content_id: int = 0
    parent_content_id: int = 0

    def forget(self) -> None:
        self.hash = None
        self.token_ids = None
        self.content_id = 0
        self.parent_content_id = 0


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        hash_key: bytes | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._key = hash_key if hash_key is not None else os.urandom(32)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        # Least recently used first: one cached block id a key, value None (a subclass may keep more there).
        self._cached: OrderedDict[int, Any] = OrderedDict()
        self._num_cached = 0
        self._by_hash: dict[bytes | int, int] = {}
        self._next_content_id = 1
        self.num_in_use = 0
        # Counted separately (NOTES bug 10): a preempted request re-hitting its own blocks inflates hits.
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return self._num_cached

    @property
    def num_allocatable(self) -> int:
        return len(self._free) + self._num_cached

    @property
    def usage(self) -> float:
        return self.num_in_use / self.num_blocks

    def _hash_block(self, parent: bytes | int | None, token_ids: SequenceABC[int]) -> bytes | int:
        return block_hash(self._key, parent, token_ids)  # type: ignore[arg-type]

    # ---- prefix cache ------------------------------------------------------------------------------
    def match_prefix(self, token_ids: SequenceABC[int] | Sequence) -> list[int]:
        """Block ids of the longest cached prefix of `token_ids` (or of a Sequence's tokens, hashing
        through its cached chain). No side effects on the cache.

        Capped below a 100% hit (NOTES bug 1): at least the last token is always computed, so the step that
        admits the request has something to run and a logit to sample from.
        """
        if not self.enable_prefix_caching:
            return []
        seq: Sequence | None = None
        toks_all: SequenceABC[int]
        if isinstance(token_ids, Sequence):
            seq, toks_all = token_ids, token_ids.token_ids
        else:
            toks_all = token_ids
        bs = self.block_size
        max_hit_blocks = (len(toks_all) - 1) // bs
        if seq is not None:
            max_hit_blocks = self._max_hit_blocks(seq, max_hit_blocks)
        hits: list[int] = []
        hashes = self._chain_of(seq) if seq is not None else []
        by_hash, blocks = self._by_hash, self.blocks
        parent_cid = 0
        for i in range(max_hit_blocks):
            if i == len(hashes):  # hashed lazily: a miss usually comes at the first block
                hashes.append(self._hash_block(hashes[-1] if i else None, toks_all[i * bs : (i + 1) * bs]))
            bid = by_hash.get(hashes[i])
            if bid is None:
                break
            block = blocks[bid]
            if block.parent_content_id != parent_cid or block.token_ids != tuple(toks_all[i * bs : (i + 1) * bs]):
                break  # a hash collision: never serve another prompt's KV
            hits.append(bid)
            parent_cid = block.content_id
        return hits

    def _max_hit_blocks(self, seq: Sequence, max_hit_blocks: int) -> int:
        """The most leading blocks of `seq` a lookup may hit (a subclass that registers fewer says fewer)."""
        return max_hit_blocks

    def hash_chain(self, seq: Sequence, num_blocks: int) -> list[bytes | int]:
        """The prefix hashes of `seq`'s first `num_blocks` full blocks (at least), each computed once per
        sequence and key and kept on it."""
        hashes = self._chain_of(seq)
        first = len(hashes)
        if first >= num_blocks:
            return hashes
        bs, key, toks = self.block_size, self._key, seq.token_ids
        parent = hashes[-1] if hashes else None
        if block_hash_replaced():  # (tests force collisions): hash through it
            for i in range(first, num_blocks):
                parent = block_hash(key, parent, toks[i * bs : (i + 1) * bs])  # type: ignore[arg-type]
                hashes.append(parent)
            return hashes
        # block_hash, unrolled over the blocks: one conversion of their tokens to bytes, sliced per block
        proto = _keyed(key)
        data = array("q", toks[first * bs : num_blocks * bs]).tobytes()
        width = bs * 8  # "q": 8 bytes a token
        for j in range(0, len(data), width):
            h = proto.copy()
            if parent is not None:
                h.update(parent)  # type: ignore[arg-type]
            h.update(data[j : j + width])
            parent = h.digest()
            hashes.append(parent)
        return hashes

    def _chain_of(self, seq: Sequence) -> list[bytes | int]:
        if seq.block_hashes_key is not self._key:  # made under another manager's key: start over
            seq.block_hashes = []
            seq.block_hashes_key = self._key
        return seq.block_hashes

    def num_blocks_to_admit(self, num_tokens: int, hits: list[int]) -> int:
        """Blocks the allocatable pool loses when a request of `num_tokens` is admitted with these hits:
        its new blocks plus the cached hits that leave the LRU list."""
        if not hits:
            return -(-num_tokens // self.block_size)
        reused_idle = sum(1 for bid in hits if self.blocks[bid].ref_count == 0)
        return cdiv(num_tokens, self.block_size) - len(hits) + reused_idle

    def can_admit(self, num_tokens: int, hits: list[int]) -> bool:
        return self.num_blocks_to_admit(num_tokens, hits) <= self.num_allocatable

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Give `seq` blocks for all its known tokens, reusing `hits`; reset its computed count to match.

        The computed count is recomputed from the allocation (NOTES bug 2), never carried over from before a
        preemption.
        """
        if seq.block_table:
            raise BlockAccountingError(f"seq {seq.seq_id} admitted while still holding {seq.block_table}")
        if not self.can_admit(seq.num_tokens, hits):
            raise BlockAccountingError(f"seq {seq.seq_id} admitted without room")
        table = [self._take_hit(bid) for bid in hits] if hits else []
        table += self._take_for(seq, len(hits), cdiv(seq.num_tokens, self.block_size) - len(hits))
        seq.block_table = table
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_hashed_blocks = len(hits)
        seq.num_cached_tokens = seq.num_computed_tokens
        if self.enable_prefix_caching:
            self.num_prefix_query_tokens += seq.num_tokens
            self.num_prefix_hit_tokens += seq.num_computed_tokens

    def num_blocks_to_grow(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks needed to write KV for the next `num_new_tokens` of `seq`."""
        need = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size) - len(seq.block_table)
        return max(need, 0)

    def append_blocks(self, seq: Sequence, num_blocks: int) -> None:
        if num_blocks > self.num_allocatable:
            raise BlockAccountingError(
                f"seq {seq.seq_id} grown by {num_blocks} blocks with {self.num_allocatable} left"
            )
        seq.block_table += self._take_for(seq, len(seq.block_table), num_blocks)

    def register_computed(self, seq: Sequence) -> None:
        """Make every full block whose KV is now written findable by its prefix hash."""
        if not self.enable_prefix_caching:
            return
        first, end = seq.num_hashed_blocks, seq.num_computed_tokens // self.block_size
        if first >= end:
            return
        seq.num_hashed_blocks = end
        self._register(seq, first, end)

    def _register(self, seq: Sequence, first: int, end: int) -> None:
        bs = self.block_size
        hashes = self.hash_chain(seq, end)
        table, blocks, by_hash = seq.block_table, self.blocks, self._by_hash
        # a block's parent is the one before it in the table: registered earlier, or a prefix hit
        parent_cid = blocks[table[first - 1]].content_id if first else 0
        tokens = iter(seq.token_ids[first * bs : end * bs])
        per_block = zip(*[tokens] * bs, strict=False)  # the tokens in tuples of bs, cut at C speed
        next_cid = self._next_content_id
        setdefault = by_hash.setdefault
        for bid, h, toks in zip(table[first:end], hashes[first:end], per_block, strict=True):
            block = blocks[bid]
            existing_id = setdefault(h, bid)  # no hash maps to a block not yet registered: bid means new
            if existing_id == bid:
                cid = next_cid
                next_cid += 1
            else:
                existing = blocks[existing_id]
                if existing.token_ids == toks and existing.parent_content_id == parent_cid:
                    cid = existing.content_id  # same prefix computed twice: share its identity
                else:
                    cid = next_cid  # collision: the first owner keeps the hash
                    next_cid += 1
            block.hash, block.token_ids = h, toks
            block.content_id, block.parent_content_id = cid, parent_cid
            parent_cid = cid
        self._next_content_id = next_cid

    def free(self, seq: Sequence, *, finished: bool = False) -> None:
        """Release `seq`'s blocks tail-first, so a shared prefix is the last thing the LRU evicts.
        `finished`: the request is over and will never be admitted again (a preemption's is not)."""
        self._release(seq, seq.block_table)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def _release(self, seq: Sequence, table: list[int]) -> None:
        """Drop `seq`'s reference to each block of `table`, tail first: a block no one holds any more is
        cached if its hash still finds it, else free."""
        blocks, by_hash, cached, free = self.blocks, self._by_hash, self._cached, self._free
        num_idle = num_cached = 0
        for bid in reversed(table):
            block = blocks[bid]
            refs = block.ref_count
            if refs <= 0:
                self.num_in_use -= num_idle
                raise BlockAccountingError(f"block {bid} freed twice (seq {seq.seq_id})")
            block.ref_count = refs = refs - 1
            if refs == 0:
                num_idle += 1
                h = block.hash
                if h is not None and by_hash.get(h) == bid:
                    cached[bid] = None
                    num_cached += 1
                else:
                    block.forget()
                    free.append(bid)
        self.num_in_use -= num_idle
        self._num_cached += num_cached

    def reset_prefix_cache(self) -> None:
        """Forget every idle cached block (e.g. between benchmark runs)."""
        while self._cached:
            bid, _ = self._cached.popitem(last=False)
            self._evict(bid)
            self._free.append(bid)
        self._num_cached = 0

    # ---- invariants --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise BlockAccountingError unless free + in use + cached == total and every state is coherent."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise BlockAccountingError("a block is on the free list twice")
        cached = set(self._cached)
        if len(cached) != self._num_cached:
            raise BlockAccountingError(f"{len(cached)} blocks cached but counted {self._num_cached}")
        if free & cached:
            raise BlockAccountingError(f"blocks both free and cached: {sorted(free & cached)}")
        in_use = 0
        for b in self.blocks:
            if b.ref_count < 0:
                raise BlockAccountingError(f"block {b.block_id} has ref_count {b.ref_count}")
            if b.ref_count > 0:
                in_use += 1
                if b.block_id in free or b.block_id in cached:
                    raise BlockAccountingError(f"block {b.block_id} in use but listed as idle")
            elif b.block_id not in free and b.block_id not in cached:
                raise BlockAccountingError(f"block {b.block_id} neither referenced, free nor cached: a leak")
        for bid in self._cached:
            h = self.blocks[bid].hash
            if h is None or self._by_hash.get(h) != bid:
                raise BlockAccountingError(f"cached block {bid} is unreachable by its hash")
        if in_use != self.num_in_use:
            raise BlockAccountingError(f"in-use count {self.num_in_use} but {in_use} blocks referenced")
        if len(free) + len(cached) + in_use != self.num_blocks:
            raise BlockAccountingError(
                f"free {len(free)} + cached {len(cached)} + in use {in_use} != total {self.num_blocks}"
            )

    def check_holders(self, seqs: SequenceABC[Sequence]) -> None:
        """Every block's reference count is the number of `seqs` (the running requests) whose table holds it."""
        refs: dict[int, int] = {}
        for seq in seqs:
            for bid in seq.block_table:
                refs[bid] = refs.get(bid, 0) + 1
        self._check_refs(refs)

    def _check_refs(self, refs: dict[int, int]) -> None:
        for block in self.blocks:
            if block.ref_count != refs.get(block.block_id, 0):
                raise AssertionError(
                    f"block {block.block_id}: ref_count {block.ref_count}, held {refs.get(block.block_id, 0)} times"
                )

    # ---- internals ---------------------------------------------------------------------------------
    def _take_hit(self, bid: int) -> int:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self._cached[bid]
            self._num_cached -= 1
            self.num_in_use += 1
        block.ref_count += 1
        return bid

    def _take_fresh(self) -> int:
        return self._take_fresh_blocks(1)[0]

    def _take_for(self, seq: Sequence, index: int, num_blocks: int) -> list[int]:
        """`num_blocks` fresh blocks for `seq`'s table from `index` on (a subclass may hold some differently)."""
        return self._take_fresh_blocks(num_blocks)

    def _take_fresh_blocks(self, num_blocks: int) -> list[int]:
        """`num_blocks` blocks with no content, free ones first, then the least recently used cached ones,
        each held once."""
        free, blocks = self._free, self.blocks
        if num_blocks <= len(free):
            taken = [free.popleft()] if num_blocks == 1 else [free.popleft() for _ in range(num_blocks)]
        else:
            taken = list(free)
            free.clear()
            need = num_blocks - len(taken)
            self._num_cached -= need
            popitem = self._cached.popitem
            for _ in range(need):
                bid, _ = popitem(False)
                self._evict(bid)
                taken.append(bid)
        for bid in taken:
            blocks[bid].ref_count = 1
        self.num_in_use += num_blocks
        return taken

    def _evict(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.hash is not None and self._by_hash.get(block.hash) == bid:
            del self._by_hash[block.hash]
        block.forget()
