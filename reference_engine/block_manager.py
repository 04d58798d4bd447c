"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, prefix caching, LRU eviction.

Every block is in exactly one of three states:
- in use: ref_count > 0 (held by one or more running sequences, shared when a prefix is cached);
- cached: ref_count == 0 but still reachable by its prefix hash, kept in an LRU list until reused;
- free: ref_count == 0 and unreachable.
Allocation takes free blocks first, then evicts the least recently used cached one.

A full, computed block is keyed by a keyed hash of (parent block's hash, its token ids). The key is secret
per process (or given in the config), so one tenant cannot predict another's hashes. A lookup hit is only
trusted after comparing the stored token ids and the identity of the parent's content, so even a forced hash
collision can never serve another prompt's KV. A simulation, where no tenant can probe the cache, may
trade the keyed hash for Python's built-in 64-bit tuple hash (`use_unkeyed_hash`): a few times cheaper a
block, and a collision, improbable as it is, is still caught by the same comparison.

Private blocks (a simulation's shortcut; `Sequence.unshared_from`). A simulator knows every prompt before the
run, so it can tell, for each request, the first block that no other request's prompt shares
(`shared_prefix_blocks`). No other request can ever hit that block or any after it (their whole prefix would
have to match), so only the request itself could, re-admitted after a preemption. Such blocks are kept
without per-block bookkeeping: never hashed nor registered, no reference count written (they count in
`num_in_use` and in `_num_private`), and when the request finishes its registered ones enter the LRU list
as one unreachable run, evicted in the same order as the blocks one by one would be. If the request is
preempted instead, they are registered there and then, as they would have been when computed, and the
request is kept like any other from then on. What differs from registering every block is which content
ids the blocks get, and which block would keep a 64-bit hash that two different blocks share: nothing a
lookup, a count or a step time can see.
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

from reference_engine.sequence import NEVER_PRIVATE, Sequence


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


@lru_cache(maxsize=64)
def _keyed(key: bytes) -> Any:
    return hashlib.blake2b(key=key, digest_size=16)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shared_prefix_blocks(prompts: SequenceABC[SequenceABC[int]], block_size: int) -> list[int]:
    """For each prompt, how many of its leading full blocks some other prompt also holds in full, at the same
    place after the same tokens (the only blocks another request's lookup could ever hit): the longest
    common prefix with any other prompt, in whole blocks. Prompts that share no first block (the usual
    case) cost one slice each; the others are sorted, and each compared with its neighbours, which hold its
    longest common prefix."""
    bs = block_size
    out = [0] * len(prompts)
    by_first: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        if len(p) >= bs:
            by_first.setdefault(tuple(p[:bs]), []).append(i)
    for group in by_first.values():
        if len(group) < 2:
            continue
        group.sort(key=lambda i: tuple(prompts[i]))
        for a, b in zip(group, group[1:], strict=False):
            pa, pb = prompts[a], prompts[b]
            lo, hi = 1, min(len(pa), len(pb)) // bs  # lo blocks are known equal (the same first block)
            while lo < hi:  # the most whole blocks equal in both
                mid = (lo + hi + 1) // 2
                if tuple(pa[: mid * bs]) == tuple(pb[: mid * bs]):
                    lo = mid
                else:
                    hi = mid - 1
            out[a], out[b] = max(out[a], lo), max(out[b], lo)
    return out


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | int | None = None  # int: the unkeyed hash (BlockManager.use_unkeyed_hash)
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
        self._unkeyed = False
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        # Least recently used first. A key >= 0 is one cached block (value None); a key < 0 is a run of private
        # blocks (the module's doc), its value their ids in the order they are evicted.
        self._cached: OrderedDict[int, list[int] | None] = OrderedDict()
        self._num_cached = 0
        self._next_run_key = -1
        self._num_private = 0  # private blocks in use (no reference count written)
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
    def num_private(self) -> int:
        """Private blocks in use (the module's doc): held by one sequence each, no reference count written."""
        return self._num_private

    @property
    def usage(self) -> float:
        return self.num_in_use / self.num_blocks

    def use_unkeyed_hash(self) -> None:
        """Key blocks by `hash((parent hash, token ids))`, Python's 64-bit tuple hash, instead of the keyed
        blake2b: for a simulation, where no tenant shares the cache, the hash values reach no result, and a
        hit is trusted only after comparing tokens either way. Call before the first request."""
        if self._by_hash:
            raise BlockAccountingError("use_unkeyed_hash on a cache that already holds blocks")
        self._unkeyed = True
        self._key = os.urandom(32)  # a fresh key object: chains a sequence kept from another manager start over

    def _hash_block(self, parent: bytes | int | None, token_ids: SequenceABC[int]) -> bytes | int:
        if self._unkeyed and block_hash is _block_hash:  # a replaced block_hash (tests) wins
            return hash((0 if parent is None else parent, tuple(token_ids)))
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
        if seq is not None and seq.unshared_from < max_hit_blocks:
            max_hit_blocks = seq.unshared_from  # none of its private blocks is registered
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

    def hash_chain(self, seq: Sequence, num_blocks: int) -> list[bytes | int]:
        """The prefix hashes of `seq`'s first `num_blocks` full blocks (at least), each computed once per
        sequence and key and kept on it."""
        hashes = self._chain_of(seq)
        first = len(hashes)
        if first >= num_blocks:
            return hashes
        bs, key, toks = self.block_size, self._key, seq.token_ids
        parent = hashes[-1] if hashes else None
        if block_hash is not _block_hash:  # replaced (tests force collisions): hash through it
            for i in range(first, num_blocks):
                parent = block_hash(key, parent, toks[i * bs : (i + 1) * bs])  # type: ignore[arg-type]
                hashes.append(parent)
            return hashes
        if self._unkeyed:  # _hash_block's hash, the blocks cut into tuples at C speed
            h = 0 if parent is None else parent
            per_block = iter(toks[first * bs : num_blocks * bs])
            for block_toks in zip(*[per_block] * bs, strict=False):
                h = hash((h, block_toks))
                hashes.append(h)
            return hashes
        # block_hash, unrolled over the blocks: one conversion of their tokens to bytes, sliced per block
        proto = _keyed(key)
        data = array("q", toks[first * bs : num_blocks * bs]).tobytes()
        width = bs * 8  # "q": 8 bytes a token
        for j in range(0, len(data), width):
            h = proto.copy()
            if parent is not None:
                h.update(parent)
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
        table += self._take_at(seq, len(hits), cdiv(seq.num_tokens, self.block_size) - len(hits))
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
        seq.block_table += self._take_at(seq, len(seq.block_table), num_blocks)

    def grow_each(self, seqs: list[Sequence]) -> None:
        """One new block for each of `seqs`, taken in their order: `append_blocks(seq, 1)` for each."""
        if len(seqs) > self.num_allocatable:
            raise BlockAccountingError(f"{len(seqs)} sequences grown by a block with {self.num_allocatable} left")
        blocks = self.blocks
        private = 0
        for seq, bid in zip(seqs, self._take_private(len(seqs)), strict=True):
            table = seq.block_table
            if len(table) < seq.unshared_from:
                blocks[bid].ref_count = 1
            else:
                private += 1
            table.append(bid)
        self._num_private += private - len(seqs)  # _take_private counted them all as private

    def register_computed(self, seq: Sequence) -> None:
        """Make every full block whose KV is now written findable by its prefix hash."""
        if not self.enable_prefix_caching:
            return
        first, end = seq.num_hashed_blocks, seq.num_computed_tokens // self.block_size
        if first >= end:
            return
        seq.num_hashed_blocks = end
        if first < seq.unshared_from:
            self._register(seq, first, min(end, seq.unshared_from))  # private blocks: counted, never hashed

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

        `finished`: the request is over and will never be admitted again, so its private blocks (the module's
        doc) can go to the LRU as one unreachable run; otherwise (a preemption) they are registered first."""
        blocks, by_hash, cached, free = self.blocks, self._by_hash, self._cached, self._free
        table = seq.block_table
        d = seq.unshared_from
        if d < len(table):
            if not finished:
                self._make_public(seq)
            else:  # the private tail: its unregistered blocks to the free list, the registered ones one LRU run
                private = table[d:]
                registered = max(seq.num_hashed_blocks - d, 0)
                if registered < len(private):
                    free.extend(reversed(private[registered:]))
                if registered:
                    run = private[:registered]
                    run.reverse()
                    cached[self._next_run_key] = run
                    self._next_run_key -= 1
                    self._num_cached += registered
                self._num_private -= len(private)
                self.num_in_use -= len(private)
                table = table[:d]
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
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def _make_public(self, seq: Sequence) -> None:
        """Register `seq`'s private blocks, as they would have been when computed, and keep it like any other
        sequence from now on (it is being preempted: its blocks may be hit when it comes back)."""
        d = seq.unshared_from
        table, blocks = seq.block_table, self.blocks
        for bid in table[d:]:
            blocks[bid].ref_count = 1
        self._num_private -= len(table) - d
        seq.unshared_from = NEVER_PRIVATE
        if seq.draw_tokens is not None:  # its output ids were stand-ins: the hashes need the real ones
            seq.draw_tokens(seq)
            seq.draw_tokens = None
        if self.enable_prefix_caching and seq.num_hashed_blocks > d:
            self._register(seq, d, seq.num_hashed_blocks)

    def reset_prefix_cache(self) -> None:
        """Forget every idle cached block (e.g. between benchmark runs)."""
        while self._cached:
            key, run = self._cached.popitem(last=False)
            if run is None:
                self._evict(key)
                self._free.append(key)
            else:
                self._free.extend(run)
        self._num_cached = 0

    # ---- invariants --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise BlockAccountingError unless free + in use + cached == total and every state is coherent."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise BlockAccountingError("a block is on the free list twice")
        cached = {key for key, run in self._cached.items() if run is None}
        in_runs = [bid for run in self._cached.values() if run is not None for bid in run]
        if len(cached) + len(in_runs) != self._num_cached:
            raise BlockAccountingError(f"{len(cached) + len(in_runs)} blocks cached but counted {self._num_cached}")
        for bid in in_runs:
            b = self.blocks[bid]
            if b.ref_count or b.hash is not None or bid in free or bid in cached:
                raise BlockAccountingError(f"block {bid} in a private run is also in use, hashed, free or cached")
        cached.update(in_runs)
        if free & cached:
            raise BlockAccountingError(f"blocks both free and cached: {sorted(free & cached)}")
        in_use = private = 0
        for b in self.blocks:
            if b.ref_count < 0:
                raise BlockAccountingError(f"block {b.block_id} has ref_count {b.ref_count}")
            if b.ref_count > 0:
                in_use += 1
                if b.block_id in free or b.block_id in cached:
                    raise BlockAccountingError(f"block {b.block_id} in use but listed as idle")
            elif b.block_id not in free and b.block_id not in cached:
                private += 1  # held by one sequence, privately (the module's doc)
        if private != self._num_private:
            raise BlockAccountingError(f"{private} blocks neither referenced, free nor cached, but "
                                       f"{self._num_private} private ones in use: a leak")
        for key, run in self._cached.items():
            h = self.blocks[key].hash if run is None else key
            if h is None or run is None and self._by_hash.get(h) != key:
                raise BlockAccountingError(f"cached block {key} is unreachable by its hash")
        if in_use + private != self.num_in_use:
            raise BlockAccountingError(f"in-use count {self.num_in_use} but {in_use} blocks referenced and "
                                       f"{private} private")
        if len(free) + len(cached) + in_use + private != self.num_blocks:
            raise BlockAccountingError(
                f"free {len(free)} + cached {len(cached)} + in use {in_use + private} != total {self.num_blocks}"
            )

    # ---- internals ---------------------------------------------------------------------------------
    def _new_content_id(self) -> int:
        cid = self._next_content_id
        self._next_content_id += 1
        return cid

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

    def _take_at(self, seq: Sequence, index: int, num_blocks: int) -> list[int]:
        """`num_blocks` fresh blocks for `seq`'s table from `index` on: held once where it shares them, private
        from its `unshared_from` on (the module's doc)."""
        private = min(num_blocks, index + num_blocks - seq.unshared_from)
        if private <= 0:
            return self._take_fresh_blocks(num_blocks)
        if private == num_blocks:
            return self._take_private(num_blocks)
        return self._take_fresh_blocks(num_blocks - private) + self._take_private(private)

    def _take_fresh_blocks(self, num_blocks: int) -> list[int]:
        """`num_blocks` blocks with no content, free ones first, then the least recently used cached ones,
        each held once."""
        taken = self._take_private(num_blocks)
        blocks = self.blocks
        for bid in taken:
            blocks[bid].ref_count = 1
        self._num_private -= num_blocks
        return taken

    def _take_private(self, num_blocks: int) -> list[int]:
        """`num_blocks` blocks with no content (free ones first, then evictions from the LRU list's head),
        counted in use as private ones: no reference count written."""
        free, blocks = self._free, self.blocks
        if num_blocks <= len(free):
            taken = [free.popleft()] if num_blocks == 1 else [free.popleft() for _ in range(num_blocks)]
        else:
            taken = list(free)
            free.clear()
            need = num_blocks - len(taken)
            self._num_cached -= need
            cached, by_hash = self._cached, self._by_hash
            popitem = cached.popitem
            key = next(iter(cached))
            run = cached[key]
            if run is not None and len(run) > need:  # (most takes, in a simulation: no change to the order)
                taken += run[:need]
                del run[:need]
                need = 0
            while need:
                key, run = popitem(False)
                if run is None:
                    block = blocks[key]  # _evict, inlined: every block a long run takes is an eviction
                    del by_hash[block.hash]  # type: ignore[arg-type]  # a cached block is its hash's owner (check())
                    block.hash = block.token_ids = None
                    block.content_id = block.parent_content_id = 0
                    taken.append(key)
                    need -= 1
                elif len(run) <= need:
                    taken += run
                    need -= len(run)
                else:  # the run's head goes; the rest stays first in line
                    taken += run[:need]
                    del run[:need]
                    cached[key] = run
                    cached.move_to_end(key, last=False)
                    need = 0
        self.num_in_use += num_blocks
        self._num_private += num_blocks
        return taken

    def evicts_any(self, bids: set[int], num_evicted: int) -> bool:
        """Whether any of `bids` (cached blocks) is among the first `num_evicted` blocks in the LRU list."""
        for key, run in self._cached.items():
            if num_evicted <= 0:
                return False
            if run is None:
                if key in bids:
                    return True
                num_evicted -= 1
            else:
                num_evicted -= len(run)
        return False

    def _evict(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.hash is not None and self._by_hash.get(block.hash) == bid:
            del self._by_hash[block.hash]
        block.forget()
