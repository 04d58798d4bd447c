"""The engine's block manager with two shortcuts a simulation can take and a server must not (a simulator's:
`slobench.fleet.sim_blocks`). It keys blocks by Python's 64-bit tuple hash instead of the keyed blake2b
(`use_unkeyed_hash`: no tenant shares the cache, and a hit is trusted only after comparing tokens either way),
and it keeps each request's private blocks (`Sequence.unshared_from`) without per-block bookkeeping
(`PrivateBlockManager`'s doc). Its public methods beyond the engine's are what a caller that takes decode
steps itself needs: `grow_each`, `evicts_any`, `admit_uncounted`, `num_private`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence as SequenceABC

from reference_engine.block_manager import BlockAccountingError, BlockManager, block_hash_replaced
from reference_engine.sequence import NEVER_PRIVATE, Sequence


class PrivateBlockManager(BlockManager):
    """A simulator knows every prompt before the run, so it can tell, for each request, the first block that no
    other request's prompt shares (`slobench.fleet.sim_blocks.shared_prefix_blocks`; `Sequence.unshared_from`). No other request can
    ever hit that block or any after it (their whole prefix would have to match), so only the request itself
    could, re-admitted after a preemption. Such private blocks are kept without per-block bookkeeping: never
    hashed nor registered, no reference count written (they count in `num_in_use` and in `num_private`), and
    when the request finishes its registered ones enter the LRU list as one unreachable run (under a key < 0),
    evicted in the same order as the blocks one by one would be. If the request is preempted instead, they are
    registered there and then, as they would have been when computed, and the request is kept like any other
    from then on. What differs from registering every block is which content ids the blocks get, and which
    block would keep a 64-bit hash that two different blocks share: nothing a lookup, a count or a step time
    can see."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 hash_key: bytes | None = None) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching, hash_key=hash_key)
        self._unkeyed = False
        self._next_run_key = -1
        self._num_private = 0  # private blocks in use (no reference count written)

    @property
    def num_private(self) -> int:
        """Private blocks in use: held by one sequence each, no reference count written."""
        return self._num_private

    def use_unkeyed_hash(self) -> None:
        """Key blocks by `hash((parent hash, token ids))`, Python's 64-bit tuple hash, instead of the keyed
        blake2b: for a simulation, where no tenant shares the cache, the hash values reach no result, and a
        hit is trusted only after comparing tokens either way. Call before the first request."""
        if self._by_hash:
            raise BlockAccountingError("use_unkeyed_hash on a cache that already holds blocks")
        self._unkeyed = True
        self._key = os.urandom(32)  # a fresh key object: chains a sequence kept from another manager start over

    def _hash_block(self, parent: bytes | int | None, token_ids: SequenceABC[int]) -> bytes | int:
        if self._unkeyed and not block_hash_replaced():  # a replaced block_hash (tests) wins
            return hash((0 if parent is None else parent, tuple(token_ids)))
        return super()._hash_block(parent, token_ids)

    def hash_chain(self, seq: Sequence, num_blocks: int) -> list[bytes | int]:
        if not self._unkeyed or block_hash_replaced():
            return super().hash_chain(seq, num_blocks)
        hashes = self._chain_of(seq)
        first = len(hashes)
        if first >= num_blocks:
            return hashes
        bs = self.block_size
        h = hashes[-1] if hashes else 0  # _hash_block's hash, the blocks cut into tuples at C speed
        per_block = iter(seq.token_ids[first * bs : num_blocks * bs])
        for block_toks in zip(*[per_block] * bs, strict=False):
            h = hash((h, block_toks))
            hashes.append(h)
        return hashes

    def admit_uncounted(self, seq: Sequence, hits: list[int]) -> None:
        """`admit`, left out of the prefix-cache counters: blocks kept for something that is not a request
        (a prefill instance holding a prompt's KV until it has been sent)."""
        queries, hit_tokens = self.num_prefix_query_tokens, self.num_prefix_hit_tokens
        self.admit(seq, hits)
        self.num_prefix_query_tokens, self.num_prefix_hit_tokens = queries, hit_tokens

    def _max_hit_blocks(self, seq: Sequence, max_hit_blocks: int) -> int:
        return seq.unshared_from if seq.unshared_from < max_hit_blocks else max_hit_blocks  # none registered past it

    def _take_for(self, seq: Sequence, index: int, num_blocks: int) -> list[int]:
        """`num_blocks` fresh blocks for `seq`'s table from `index` on: held once where it shares them, private
        from its `unshared_from` on (the class's doc)."""
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

    def free(self, seq: Sequence, *, finished: bool = False) -> None:
        """Release `seq`'s blocks tail-first, so a shared prefix is the last thing the LRU evicts.

        `finished`: the request is over and will never be admitted again, so its private blocks (the module's
        doc) can go to the LRU as one unreachable run; otherwise (a preemption) they are registered first."""
        cached, free = self._cached, self._free
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
        self._release(seq, table)
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
                private += 1  # held by one sequence, privately (the class's doc)
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


    def check_holders(self, seqs: SequenceABC[Sequence]) -> None:
        """As the engine's, a private block (past its sequence's `unshared_from`) held by that sequence alone."""
        refs: dict[int, int] = {}
        private: set[int] = set()
        for seq in seqs:
            for i, bid in enumerate(seq.block_table):
                if i >= seq.unshared_from:
                    if bid in private:
                        raise AssertionError(f"private block {bid} held twice")
                    private.add(bid)
                else:
                    refs[bid] = refs.get(bid, 0) + 1
        if not private.isdisjoint(refs) or len(private) != self._num_private:
            raise AssertionError(f"{len(private)} private blocks held, {self._num_private} counted, "
                                 f"{len(private & refs.keys())} also referenced")
        self._check_refs(refs)

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
