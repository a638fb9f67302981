"""Block accounting for the single unified llama.cpp KV cache.

(Over 300 lines on purpose: one class whose invariants — refcounts, chained cache entries, leaf
eviction — hold only together, and tests/test_kv_blocks.py checks them together.)

The engine never lets llama.cpp find out that its cache is full: every cell it is about to fill
is first reserved here, in blocks of `block_size` tokens. This module is bookkeeping only; after
each call the engine performs the matching llama.cpp memory operations itself (copying a cached
prefix into a new sequence, removing the cells of a finished or evicted one).

Vocabulary:
  owner        a running sequence (the engine's seq id) with a block table covering its tokens;
               n tokens in KV hold ceil(n / block_size) blocks.
  prefix cache full blocks kept after their owner finished, keyed by a hash chained over the
               whole prefix, so that a later prompt starting with the same tokens can share them.
  idle         a cached block no owner references; it costs nothing to reclaim, so admission
               counts it as available and allocation evicts it on demand.

Eviction policy: least recently used *leaf* first. A leaf is a cached block that no other cached
block names as its parent; evicting a leaf may turn its parent into one. Because an owner always
references a whole chain from the root, an idle block's descendants are idle too, so evicting
leaves one at a time can reach every idle block, and a cached chain never has a hole.

The ledger is not thread-safe: it is meant to be driven by the engine's single scheduler thread.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from engine.ownership import SingleWriter

# (parent block's key or None for a prompt's first block, this block's tokens) -> key
HashFn = Callable[[Hashable | None, tuple[int, ...]], Hashable]

H = TypeVar("H")  # the engine's note of where a cached block's cells live (its holder seq id)

# Shared by all ledgers so that a match can never be mistaken for one made by another ledger.
_serials = itertools.count(1)


class LedgerError(Exception):
    """Base class for the ledger's own errors."""


class OutOfBlocks(LedgerError):
    """Not enough free or evictable blocks. Nothing changed; preempt something and retry."""

    def __init__(self, needed: int, available: int) -> None:
        super().__init__(f"need {needed} blocks, only {available} free or evictable")
        self.needed = needed
        self.available = available


class StaleMatch(LedgerError):
    """A PrefixMatch refers to cache entries that were evicted since the lookup."""


@dataclass(frozen=True)
class CachedBlock(Generic[H]):
    """A prefix-cache entry as seen from outside: what `cache_entry` shows and eviction reports.

    The block holds tokens[start : start + block_size] of every prompt that starts with the
    chain ending here; `holder` is the engine's opaque note of where those cells live.
    """

    block: int
    start: int
    tokens: tuple[int, ...]
    parent: int | None
    holder: H


@dataclass(frozen=True)
class PrefixMatch(Generic[H]):
    """Result of `lookup`: the longest cached chain covering a prompt's leading full blocks.

    Taking it changes no refcount; pass it to `allocate` to share the blocks. It goes stale if
    those entries are evicted before then, which `allocate` detects (StaleMatch).
    """

    blocks: tuple[int, ...] = ()
    n_tokens: int = 0
    holders: tuple[H, ...] = ()
    _serials: tuple[int, ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class LedgerStats:
    """used: referenced by at least one owner; cached: held only by the prefix cache (idle)."""

    total: int
    used: int
    cached: int
    free: int
    queries: int
    hits: int
    hit_tokens: int
    evictions: int


@dataclass(eq=False)  # identity semantics: entries are compared and hashed as objects
class _Entry(Generic[H]):
    block: int
    key: Hashable
    parent: _Entry | None
    tokens: tuple[int, ...]
    start: int
    holder: H
    serial: int
    last_used: int
    children: set[_Entry] = field(default_factory=set)

    def view(self) -> CachedBlock[H]:
        parent = None if self.parent is None else self.parent.block
        return CachedBlock(self.block, self.start, self.tokens, parent, self.holder)


def _default_hash(parent_key: Hashable | None, tokens: tuple[int, ...]) -> Hashable:
    return hash((parent_key, tokens))


def _owned(plan: list[tuple[str, _Entry]]) -> list[tuple[str, _Entry]]:
    """A publish plan up to its first duplicate: only a chain the owner holds from its root is
    published (an entry under another owner's block would stay referenced while its idle parent
    could not be evicted)."""
    return plan[: next((i for i, (kind, _) in enumerate(plan) if kind == "duplicate"), len(plan))]


class BlockLedger(SingleWriter, Generic[H]):
    """Refcounted blocks, per-owner block tables and a prefix cache over `n_blocks` blocks.

    `hash_fn(parent_key, block_tokens)` keys cache entries; it only has to be deterministic.
    Lookups compare the stored tokens and parent, so a colliding hash costs a miss, never a
    wrong hit (tests inject a deliberately bad one).

    Invariants, checked by `check`: every block is free (refcount 0, on the free list), or
    referenced: its refcount is the number of owner tables naming it plus one if the prefix
    cache holds it; an owner's table has exactly the blocks its token count needs; every cache
    entry's parent is cached and names it as a child, at the next block position; and the idle
    count is the number of cached blocks no owner references.
    """

    def __init__(self, n_blocks: int, block_size: int, hash_fn: HashFn | None = None) -> None:
        if n_blocks < 0 or block_size <= 0:
            raise ValueError(f"need n_blocks >= 0 and block_size > 0, got {n_blocks}, {block_size}")
        self.n_blocks = n_blocks
        self.block_size = block_size
        self._hash = hash_fn or _default_hash
        self._ref = [0] * n_blocks  # owner references + 1 if the cache holds the block
        self._free = list(reversed(range(n_blocks)))  # popped from the end: block 0 goes first
        self._tables: dict[int, list[int]] = {}
        self._n_tokens: dict[int, int] = {}
        self._entries: dict[int, _Entry[H]] = {}  # block -> its cache entry
        self._buckets: dict[Hashable, list[_Entry[H]]] = {}  # hash -> entries (several on collision)
        self._idle = 0  # cached blocks with no owner; kept incrementally for cheap admission
        self._clock = 0
        self._evicted: list[CachedBlock[H]] = []
        self._queries = self._hits = self._hit_tokens = self._evictions = 0

    # ---- prefix cache --------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int]) -> PrefixMatch[H]:
        """Longest cached chain for `tokens`, at most floor((len - 1) / block_size) blocks.

        The last prompt token is never covered: the engine must decode at least one token to get
        logits. Counts a query (and a hit if anything matched) and refreshes the matched
        entries' LRU position, so call it once per admission decision.
        """
        bs = self.block_size
        matched: list[_Entry] = []
        parent: _Entry | None = None
        for i in range(max(0, (len(tokens) - 1) // bs)):
            entry = self._find(parent, tuple(tokens[i * bs : (i + 1) * bs]))
            if entry is None:
                break
            matched.append(entry)
            parent = entry
        self._queries += 1
        if matched:
            self._hits += 1
            self._hit_tokens += len(matched) * bs
            for entry in matched:
                self._touch(entry)
        return PrefixMatch(
            blocks=tuple(e.block for e in matched),
            n_tokens=len(matched) * bs,
            holders=tuple(e.holder for e in matched),
            _serials=tuple(e.serial for e in matched),
        )

    def evict(self, n_blocks: int) -> list[CachedBlock[H]]:
        """Evict up to `n_blocks` idle cached blocks, LRU leaf first; returns what was evicted.

        The engine must remove those cells from llama.cpp. These are returned here only, not
        also queued for `pop_evicted`.
        """
        if n_blocks < 0:
            raise ValueError(f"n_blocks must be >= 0, got {n_blocks}")
        return self._evict(n_blocks)

    def pop_evicted(self) -> list[CachedBlock[H]]:
        """Entries evicted implicitly by `allocate` / `grow` since the last call; drains them.

        Call after every successful allocate or grow, before touching llama.cpp: those blocks
        may already belong to the new owner.
        """
        out, self._evicted = self._evicted, []
        return out

    # ---- owners --------------------------------------------------------------------------

    def blocks_needed(self, n_tokens: int, match: PrefixMatch | None = None) -> int:
        """Fresh blocks an admission of `n_tokens` tokens would take, given the shared prefix."""
        match = match or PrefixMatch()
        self._check_size(n_tokens, match)
        return self._blocks_for(n_tokens) - len(match.blocks)

    def can_allocate(self, n_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Whether `allocate` would succeed: idle cached blocks count as available.

        Raises StaleMatch for a match whose entries were evicted since the lookup.
        """
        match = match or PrefixMatch()
        self._check_match(match)
        return self.blocks_needed(n_tokens, match) <= self._available(match)

    def allocate(self, owner: int, n_tokens: int, match: PrefixMatch | None = None) -> list[int]:
        """Admit `owner` holding `n_tokens` tokens, sharing `match`'s blocks; returns its table.

        Takes fresh blocks from the free list, evicting idle cached ones if it must (see
        `pop_evicted`). Raises OutOfBlocks, StaleMatch or ValueError without changing anything.
        """
        match = match or PrefixMatch()
        if owner in self._tables:
            raise ValueError(f"owner {owner} already holds blocks")
        self._check_match(match)
        need = self.blocks_needed(n_tokens, match)
        available = self._available(match)
        if need > available:
            raise OutOfBlocks(need, available)
        # Pin the shared blocks before evicting so that eviction cannot take them.
        for b in match.blocks:
            self._incref(b)
        table = list(match.blocks) + self._take(need)
        self._tables[owner] = table
        self._n_tokens[owner] = n_tokens
        return list(table)

    def can_grow(self, owner: int, n_tokens_total: int) -> bool:
        """Whether `grow(owner, n_tokens_total)` would succeed."""
        return self._growth(owner, n_tokens_total) <= self._available(PrefixMatch())

    def shrink(self, owner: int, n_tokens_total: int) -> list[int]:
        """Cut `owner`'s table to the blocks `n_tokens_total` tokens need; returns the blocks
        dropped (freed, or left idle in the prefix cache if it holds them)."""
        table = self._table(owner)
        if not 0 <= n_tokens_total <= self._n_tokens[owner]:
            raise ValueError(f"owner {owner} holds {self._n_tokens[owner]} tokens, cannot shrink to {n_tokens_total}")
        keep = self._blocks_for(n_tokens_total)
        dropped = table[keep:]
        del table[keep:]
        for b in dropped:
            self._decref(b)
        self._n_tokens[owner] = n_tokens_total
        return dropped

    def grow(self, owner: int, n_tokens_total: int) -> list[int]:
        """Extend `owner`'s table to cover `n_tokens_total` tokens; returns the blocks added.

        Same eviction and failure rules as `allocate`. Shrinking is refused (ValueError).
        """
        need = self._growth(owner, n_tokens_total)
        available = self._available(PrefixMatch())
        if need > available:
            raise OutOfBlocks(need, available)
        added = self._take(need)
        self._tables[owner].extend(added)
        self._n_tokens[owner] = n_tokens_total
        return added

    def release(self, owner: int, cache_tokens: Sequence[int] | None = None, holder: H | None = None) -> range:
        """Drop `owner`; optionally keep the full blocks of `cache_tokens` in the prefix cache.

        `cache_tokens` are the tokens whose KV sits in the owner's leading cells (its prompt, or
        prompt + reply); only their full blocks are cached, each new entry noting `holder`.
        A block whose content is already cached under another block is not duplicated: that
        entry is refreshed and this block freed. Returns the token positions newly cached under
        `holder`: the engine keeps those cells of this sequence and removes the rest. Blocks no
        one else references go back to the free list.
        """
        table = self._table(owner)
        kept = self._apply_caching(self._plan_caching(owner, table, () if cache_tokens is None else cache_tokens, holder))
        for b in table:
            self._decref(b)
        del self._tables[owner], self._n_tokens[owner]
        return kept

    def publish(self, owner: int, cache_tokens: Sequence[int], holder: H) -> range:
        """Put the full blocks of `cache_tokens` in the prefix cache while `owner` keeps them:
        as `release` does, without the release. Returns the positions newly cached under
        `holder` (the engine tags those cells with it, so they outlive the owner)."""
        return self._apply_caching(_owned(self._plan_caching(owner, self._table(owner), cache_tokens, holder)))

    def caching_start(self, owner: int, cache_tokens: Sequence[int], publishing: bool) -> tuple[int, H | None]:
        """Where the tokens newly cached by `publish` (or `release`) would start, and the holder
        of the cached block just before them (None if there is none). Changes nothing."""
        plan = self._plan_caching(owner, self._table(owner), cache_tokens, None)
        if publishing:
            plan = _owned(plan)
        first_new = next((i for i, (kind, _) in enumerate(plan) if kind == "new"), len(plan))
        return first_new * self.block_size, plan[first_new - 1][1].holder if first_new else None

    # ---- introspection -------------------------------------------------------------------

    def table(self, owner: int) -> tuple[int, ...]:
        """`owner`'s block table, in token order."""
        return tuple(self._table(owner))

    def n_tokens(self, owner: int) -> int:
        """How many tokens `owner`'s table was sized for."""
        self._table(owner)
        return self._n_tokens[owner]

    def owners(self) -> tuple[int, ...]:
        return tuple(self._tables)

    def refcount(self, block: int) -> int:
        """Owner references plus 1 if the prefix cache holds the block."""
        return self._ref[block]

    def cache_entry(self, block: int) -> CachedBlock[H] | None:
        entry = self._entries.get(block)
        return None if entry is None else entry.view()

    def cache_entries(self) -> Iterator[CachedBlock[H]]:
        """Every prefix-cache entry, in no particular order."""
        return (entry.view() for entry in self._entries.values())

    def check(self) -> None:
        """Raise AssertionError unless the invariants in the class docstring hold."""
        refs = [0] * self.n_blocks
        for owner, table in self._tables.items():
            assert len(table) == self._blocks_for(self._n_tokens[owner]), f"owner {owner}'s table is mis-sized"
            for b in table:
                refs[b] += 1
        for b, entry in self._entries.items():
            refs[b] += 1
            assert entry.block == b and entry in self._buckets.get(entry.key, ()), f"cache entry {b} is misfiled"
            parent = entry.parent
            assert parent is None or (self._entries.get(parent.block) is parent and entry in parent.children
                                      and parent.start + self.block_size == entry.start), f"cached block {b}'s chain"
            assert parent is not None or entry.start == 0, f"cached block {b} has no parent past position 0"
        assert refs == self._ref, "refcounts differ from the tables and the cache"
        free = set(self._free)
        assert len(free) == len(self._free) and free == {b for b, r in enumerate(refs) if r == 0}, "free list"
        assert self._idle == sum(1 for b in self._entries if refs[b] == 1), "idle count"

    @property
    def stats(self) -> LedgerStats:
        """Counted from the current refcounts and free list, not derived from each other."""
        # A block is used if something besides the cache's own reference holds it.
        used = sum(1 for b, r in enumerate(self._ref) if r - (b in self._entries) > 0)
        cached = sum(1 for b in self._entries if self._ref[b] == 1)
        return LedgerStats(
            total=self.n_blocks,
            used=used,
            cached=cached,
            free=len(self._free),
            queries=self._queries,
            hits=self._hits,
            hit_tokens=self._hit_tokens,
            evictions=self._evictions,
        )

    # ---- internals -----------------------------------------------------------------------

    def _table(self, owner: int) -> list[int]:
        try:
            return self._tables[owner]
        except KeyError:
            raise KeyError(f"unknown owner {owner!r}") from None

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def _check_size(self, n_tokens: int, match: PrefixMatch) -> None:
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if match.blocks and n_tokens <= match.n_tokens:
            raise ValueError(
                f"{n_tokens} tokens with a {match.n_tokens}-token cached prefix: "
                "at least one token after the prefix must be computed"
            )

    def _check_match(self, match: PrefixMatch) -> None:
        if len(match.blocks) != len(match._serials):
            raise StaleMatch("this PrefixMatch did not come from lookup")
        for b, serial in zip(match.blocks, match._serials):
            entry = self._entries.get(b)
            if entry is None or entry.serial != serial:
                raise StaleMatch(f"cached block {b} of the match is no longer the one looked up")

    def _growth(self, owner: int, n_tokens_total: int) -> int:
        table = self._table(owner)
        current = self._n_tokens[owner]
        if n_tokens_total < current:
            raise ValueError(
                f"owner {owner} holds {current} tokens, cannot shrink to {n_tokens_total}"
            )
        return self._blocks_for(n_tokens_total) - len(table)

    def _available(self, match: PrefixMatch) -> int:
        # Idle matched blocks stop being evictable the moment the match is taken.
        pinned = sum(1 for b in match.blocks if self._ref[b] == 1)
        return len(self._free) + self._idle - pinned

    def _take(self, n: int) -> list[int]:
        """Pop n free blocks, evicting first if needed; the caller has checked availability."""
        short = n - len(self._free)
        if short > 0:
            evicted = self._evict(short)
            assert len(evicted) == short, "availability was checked beforehand"
            self._evicted.extend(evicted)
        taken = [self._free.pop() for _ in range(n)]
        for b in taken:
            self._ref[b] = 1
        return taken

    def _incref(self, b: int) -> None:
        if self._ref[b] == 1 and b in self._entries:
            self._idle -= 1
        self._ref[b] += 1

    def _decref(self, b: int) -> None:
        self._ref[b] -= 1
        if self._ref[b] == 0:
            self._free.append(b)
        elif self._ref[b] == 1 and b in self._entries:
            self._idle += 1

    def _touch(self, entry: _Entry) -> None:
        self._clock += 1
        entry.last_used = self._clock

    def _find(self, parent: _Entry | None, tokens: tuple[int, ...]) -> _Entry | None:
        key = self._hash(None if parent is None else parent.key, tokens)
        for entry in self._buckets.get(key, ()):
            # The hash alone proves nothing: check the content and the whole prefix (by parent).
            if entry.parent is parent and entry.tokens == tokens:
                return entry
        return None

    def _apply_caching(self, plan: list[tuple[str, _Entry]]) -> range:
        first_new = len(plan)
        for i, (kind, entry) in enumerate(plan):
            if kind == "new":
                first_new = min(first_new, i)
                self._ref[entry.block] += 1  # the cache's own reference
                self._entries[entry.block] = entry
                self._buckets.setdefault(entry.key, []).append(entry)
                if entry.parent is not None:
                    entry.parent.children.add(entry)
            self._touch(entry)
        bs = self.block_size
        return range(first_new * bs, len(plan) * bs)

    def _plan_caching(
        self, owner: int, table: list[int], cache_tokens: Sequence[int], holder: H | None
    ) -> list[tuple[str, _Entry]]:
        """Decide, without changing anything, which entry stands for each full block."""
        bs = self.block_size
        if len(cache_tokens) > self._n_tokens[owner]:
            raise ValueError(
                f"owner {owner} holds {self._n_tokens[owner]} tokens, "
                f"cannot cache {len(cache_tokens)}"
            )
        plan: list[tuple[str, _Entry]] = []
        parent: _Entry | None = None
        for i in range(len(cache_tokens) // bs):
            tokens = tuple(cache_tokens[i * bs : (i + 1) * bs])
            block = table[i]
            entry = self._entries.get(block)
            if entry is not None:  # shared from a hit: it must be what the engine says it is
                if entry.tokens != tokens or entry.parent is not parent:
                    raise ValueError(
                        f"block {block} of owner {owner} is cached with other tokens/prefix "
                        f"than cache_tokens[{i * bs}:{(i + 1) * bs}]"
                    )
                plan.append(("known", entry))
            elif (entry := self._find(parent, tokens)) is not None:
                plan.append(("duplicate", entry))
            else:
                entry = _Entry(
                    block=block,
                    key=self._hash(None if parent is None else parent.key, tokens),
                    parent=parent,
                    tokens=tokens,
                    start=i * bs,
                    holder=holder,
                    serial=next(_serials),
                    last_used=0,
                )
                plan.append(("new", entry))
            parent = entry
        return plan

    def _evict(self, n: int) -> list[CachedBlock]:
        heap = [
            (e.last_used, e.block)
            for e in self._entries.values()
            if self._ref[e.block] == 1 and not e.children
        ]
        heapq.heapify(heap)
        out: list[CachedBlock] = []
        while len(out) < n and heap:
            _, block = heapq.heappop(heap)
            entry = self._entries.pop(block)
            bucket = self._buckets[entry.key]
            bucket.remove(entry)
            if not bucket:
                del self._buckets[entry.key]
            parent = entry.parent
            if parent is not None:
                parent.children.discard(entry)
                if not parent.children and self._ref[parent.block] == 1:
                    heapq.heappush(heap, (parent.last_used, parent.block))
            self._idle -= 1
            self._ref[block] = 0
            self._free.append(block)
            self._evictions += 1
            out.append(entry.view())
        return out
