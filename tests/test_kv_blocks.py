"""Tests for engine.kv_blocks: a model-checked state machine plus focused unit tests.

(Over 300 lines on purpose: the unit tests reuse the state machine's model of block contents.)

The state machine keeps its own model of what each block *physically* holds: the full token
prefix whose KV was computed into it (KV depends on every earlier token, not only the block's
own). A prefix hit is correct only if the shared block's physical prefix equals the new prompt's
prefix, which is checked against that model, independently of the ledger's own bookkeeping.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from engine.kv_blocks import BlockLedger, CachedBlock, OutOfBlocks, PrefixMatch, StaleMatch

BS = 4
N_BLOCKS = 8

# Prompts chosen so that prefixes collide often: P1 and P2 share leading blocks with P0, P3 has
# P0's block contents at other positions (a trap for a hash that ignores the parent).
_P0 = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
POOL = (
    _P0,
    _P0[:8] + (20, 21, 22, 23, 24),
    _P0[:4] + (30, 31),
    (5, 6, 7, 8, 1, 2, 3, 4, 9),
    _P0[:8],
    (1, 2, 3, 4),
    (7,),
)
SUFFIX = st.lists(st.integers(0, 2), max_size=6)


def snapshot(ledger: BlockLedger) -> tuple:
    """Everything observable about a ledger, to prove a failed call changed nothing."""
    owners = ledger.owners()
    return (
        ledger.stats,
        owners,
        tuple(ledger.table(o) for o in owners),
        tuple(ledger.n_tokens(o) for o in owners),
        tuple(ledger.cache_entry(b) for b in range(ledger.n_blocks)),
        tuple(ledger.refcount(b) for b in range(ledger.n_blocks)),
    )


def chain_tokens(ledger: BlockLedger, block: int) -> tuple[int, ...]:
    """The whole prefix a cached block stands for, walking its parents; fails on a hole."""
    parts = []
    entry = ledger.cache_entry(block)
    while entry is not None:
        parts.append(entry.tokens)
        if entry.parent is None:
            break
        parent = ledger.cache_entry(entry.parent)
        assert parent is not None, f"cached block {entry.block} has an uncached parent"
        entry = parent
    return tuple(t for part in reversed(parts) for t in part)


class LedgerMachine(RuleBasedStateMachine):
    hash_fn = None

    def __init__(self) -> None:
        super().__init__()
        self.ledger = BlockLedger(N_BLOCKS, BS, hash_fn=type(self).hash_fn)
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.n_shared: dict[int, int] = {}
        self.prompt_len: dict[int, int] = {}
        self.phys: dict[int, tuple[int, ...]] = {}  # block -> prefix its KV was computed for
        self.cached: dict[int, object] = {}  # block -> holder, as the model expects
        self.recency: dict[int, int] = {}
        self.clock = 0
        self.cached_seqs: list[tuple[int, ...]] = []
        self.waiting: list[tuple[int, ...]] = []  # preempted sequences' tokens
        self.next_owner = 0
        self.generation: dict[int, int] = {}  # bumped on every eviction of a block
        self.saved_matches: list[tuple[PrefixMatch, tuple[int, ...]]] = []
        self.counts = {"queries": 0, "hits": 0, "hit_tokens": 0, "evictions": 0}

    owners = Bundle("owners")

    # ---- model helpers -------------------------------------------------------------------

    def touch(self, block: int) -> None:
        self.clock += 1
        self.recency[block] = self.clock

    def referenced(self) -> set[int]:
        return {b for table in self.tables.values() for b in table}

    def model_free(self) -> int:
        return N_BLOCKS - len(self.referenced() | set(self.cached))

    def idle(self, pinned: frozenset[int] = frozenset()) -> int:
        return len(set(self.cached) - self.referenced() - pinned)

    def cached_by_prefix(self) -> dict[tuple[int, ...], int]:
        return {self.phys[b]: b for b in self.cached}

    def expected_match(self, tokens: tuple[int, ...]) -> int:
        by_prefix = self.cached_by_prefix()
        k = 0
        while k < (len(tokens) - 1) // BS and tokens[: (k + 1) * BS] in by_prefix:
            k += 1
        return k

    def lru_victims(self, n: int, pinned: frozenset[int] = frozenset()) -> list[int]:
        """Leaf-first LRU, computed from the model's own recency and physical prefixes."""
        candidates = set(self.cached) - self.referenced() - pinned
        remaining = set(self.cached)
        out = []
        while len(out) < n:
            leaves = [
                b
                for b in candidates
                if not any(c != b and self.phys[c][:-BS] == self.phys[b] for c in remaining)
            ]
            if not leaves:
                break
            victim = min(leaves, key=self.recency.__getitem__)
            out.append(victim)
            candidates.discard(victim)
            remaining.discard(victim)
        return out

    def forget(self, evicted: list[CachedBlock], expected: list[int]) -> None:
        assert [e.block for e in evicted] == expected
        for e in evicted:
            assert e.holder == self.cached.pop(e.block)
            self.generation[e.block] = self.generation.get(e.block, 0) + 1
            assert self.phys[e.block][-BS:] == e.tokens
            assert len(self.phys[e.block]) == e.start + BS
            del self.recency[e.block]
        self.counts["evictions"] += len(evicted)

    def write_phys(self, owner: int) -> None:
        toks = tuple(self.tokens[owner])
        for i, b in enumerate(self.tables[owner]):
            if i >= self.n_shared[owner]:
                self.phys[b] = toks[: (i + 1) * BS]

    # ---- admission -----------------------------------------------------------------------

    def lookup(self, tokens: tuple[int, ...]) -> PrefixMatch:
        k = self.expected_match(tokens)
        match = self.ledger.lookup(tokens)
        self.counts["queries"] += 1
        assert len(match.blocks) == k, "lookup must find exactly the longest cached prefix"
        assert match.n_tokens == k * BS
        assert k * BS < len(tokens), "the last prompt token is never served from cache"
        for i, b in enumerate(match.blocks):
            assert self.ledger.cache_entry(b).tokens == tokens[i * BS : (i + 1) * BS]
            assert self.phys[b] == tokens[: (i + 1) * BS], "wrong KV would be shared"
            assert match.holders[i] == self.cached[b]
            self.touch(b)
        if k:
            self.counts["hits"] += 1
            self.counts["hit_tokens"] += k * BS
            self.saved_matches = self.saved_matches[-4:] + [(match, self.generations(match))]
        event(f"lookup matched {k} blocks")
        return match

    def generations(self, match: PrefixMatch) -> tuple[int, ...]:
        return tuple(self.generation.get(b, 0) for b in match.blocks)

    def admit(self, tokens: tuple[int, ...], use_cache: bool, peeks=()):
        ledger = self.ledger
        n = len(tokens)
        match = self.lookup(tokens) if use_cache else None
        k = len(match.blocks) if match else 0
        # The scheduler may look at other queued prompts before admitting this one; their hits
        # make other blocks more recent than this match's, so only pinning protects it.
        for other in peeks:
            self.lookup(tuple(other))
        pinned = frozenset(match.blocks if match else ())
        need = math.ceil(n / BS) - k
        assert ledger.blocks_needed(n, match) == need
        free = self.model_free()
        fits = need <= free + self.idle(pinned)
        assert ledger.can_allocate(n, match) == fits
        owner = self.next_owner
        self.next_owner += 1
        if not fits:
            event("admission refused")
            before = snapshot(ledger)
            with pytest.raises(OutOfBlocks):
                ledger.allocate(owner, n, match)
            assert snapshot(ledger) == before
            return None
        victims = self.lru_victims(max(0, need - free), pinned)
        event(f"admission evicted {bool(victims)}")
        table = ledger.allocate(owner, n, match)
        self.forget(ledger.pop_evicted(), victims)
        assert tuple(table[:k]) == (match.blocks if match else ())
        fresh = table[k:]
        assert len(fresh) == need and len(set(fresh)) == need
        assert not set(fresh) & (self.referenced() | set(self.cached))
        self.tables[owner] = list(table)
        self.tokens[owner] = list(tokens)
        self.n_shared[owner] = k
        self.prompt_len[owner] = n
        self.write_phys(owner)
        return owner

    # ---- rules ---------------------------------------------------------------------------

    @rule(
        target=owners,
        prompt=st.sampled_from(POOL),
        suffix=SUFFIX,
        use_cache=st.booleans(),
        peeks=st.lists(st.sampled_from(POOL), max_size=2),
    )
    def admit_prompt(self, prompt, suffix, use_cache, peeks):
        owner = self.admit(tuple(prompt) + tuple(suffix), use_cache, peeks)
        return multiple() if owner is None else owner

    @precondition(lambda self: self.cached_seqs)
    @rule(target=owners, data=st.data(), suffix=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def fork_from_cached(self, data, suffix):
        base = data.draw(st.sampled_from(self.cached_seqs))
        owner = self.admit(base + tuple(suffix), use_cache=True)
        return multiple() if owner is None else owner

    @precondition(lambda self: self.saved_matches)
    @rule(data=st.data())
    def reuse_an_old_match(self, data):
        """A match kept across evictions must be refused, never silently share other KV."""
        match, generations = data.draw(st.sampled_from(self.saved_matches))
        n = match.n_tokens + 1
        if generations == self.generations(match):
            # Still valid: it needs one fresh block for the token after the prefix.
            fits = 1 <= self.model_free() + self.idle(frozenset(match.blocks))
            assert self.ledger.can_allocate(n, match) == fits
            return
        event("stale match refused")
        before = snapshot(self.ledger)
        with pytest.raises(StaleMatch):
            self.ledger.can_allocate(n, match)
        with pytest.raises(StaleMatch):
            self.ledger.allocate(self.next_owner, n, match)
        assert snapshot(self.ledger) == before

    @rule(owner=owners, new=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def grow(self, owner, new):
        if owner not in self.tables:  # already drained
            return
        ledger = self.ledger
        total = len(self.tokens[owner]) + len(new)
        need = math.ceil(total / BS) - len(self.tables[owner])
        free = self.model_free()
        fits = need <= free + self.idle()
        assert ledger.can_grow(owner, total) == fits
        if not fits:
            before = snapshot(ledger)
            with pytest.raises(OutOfBlocks):
                ledger.grow(owner, total)
            assert snapshot(ledger) == before
            return
        victims = self.lru_victims(max(0, need - free))
        event(f"growth evicted {bool(victims)}")
        added = ledger.grow(owner, total)
        self.forget(ledger.pop_evicted(), victims)
        assert len(added) == need
        assert not set(added) & (self.referenced() | set(self.cached))
        self.tables[owner].extend(added)
        self.tokens[owner].extend(new)
        self.write_phys(owner)

    @rule(owner=owners, k=st.integers(1, 6))
    def shrink(self, owner, k):
        # Tokens computed tentatively and rejected (speculative drafts): never below the prompt.
        if owner not in self.tables:  # already drained
            return
        total = max(self.prompt_len[owner], len(self.tokens[owner]) - k)
        keep = math.ceil(total / BS)
        expected = self.tables[owner][keep:]
        assert self.ledger.shrink(owner, total) == expected
        assert not set(expected) & set(self.cached), "a prompt block was dropped"
        del self.tables[owner][keep:]
        del self.tokens[owner][total:]
        assert self.ledger.n_tokens(owner) == total

    def finish(self, owner: int, cache_tokens: tuple[int, ...] | None) -> None:
        holder = ("seq", owner, self.clock)
        table = self.tables.pop(owner)
        kept = self.ledger.release(owner, cache_tokens, holder=holder)
        del self.tokens[owner], self.n_shared[owner], self.prompt_len[owner]
        self.expect_cached(table, cache_tokens, holder, kept)

    @rule(owner=owners)
    def publish_prompt(self, owner):
        # A running sequence's computed prompt blocks enter the cache while it keeps them.
        if owner not in self.tables:  # already drained
            return
        holder = ("published", owner, self.clock)
        table = self.tables[owner]
        cache_tokens = tuple(self.tokens[owner][: self.prompt_len[owner]])
        # Published: the leading blocks that are its own (a block whose content another block
        # holds in the cache ends the chain it can publish).
        by_prefix = self.cached_by_prefix()
        own = 0
        while own < len(cache_tokens) // BS and by_prefix.get(cache_tokens[: (own + 1) * BS], table[own]) == table[own]:
            own += 1
        kept = self.ledger.publish(owner, cache_tokens, holder)
        self.expect_cached(table, cache_tokens[: own * BS], holder, kept)

    def expect_cached(self, table: list[int], cache_tokens: tuple[int, ...] | None, holder: object,
                      kept: range) -> None:
        n_full = len(cache_tokens or ()) // BS
        expected_new = []
        for i in range(n_full):
            prefix = cache_tokens[: (i + 1) * BS]
            existing = self.cached_by_prefix().get(prefix)
            if existing is None:
                assert self.phys[table[i]] == prefix
                self.cached[table[i]] = holder
                expected_new.append(i * BS)
                existing = table[i]
            self.touch(existing)
        assert list(kept)[::BS] == expected_new
        assert kept.step == 1 and (not kept or kept.stop == n_full * BS)
        if n_full:
            self.cached_seqs.append(tuple(cache_tokens))

    @rule(owner=consumes(owners), whole=st.booleans())
    def finish_with_caching(self, owner, whole):
        if owner not in self.tables:  # already drained
            return
        toks = self.tokens[owner]
        self.finish(owner, tuple(toks if whole else toks[: self.prompt_len[owner]]))

    @rule(owner=consumes(owners))
    def finish_without_caching(self, owner):
        if owner not in self.tables:  # already drained
            return
        self.finish(owner, None)

    @rule(owner=consumes(owners))
    def preempt(self, owner):
        # The scheduler frees a victim's blocks and requeues it to be recomputed later.
        if owner not in self.tables:  # already drained
            return
        self.waiting.append(tuple(self.tokens[owner]))
        self.finish(owner, None)

    @precondition(lambda self: self.waiting)
    @rule(target=owners)
    def resume_preempted(self):
        owner = self.admit(self.waiting.pop(0), use_cache=True)
        return multiple() if owner is None else owner

    @rule(n=st.integers(0, 5))
    def evict(self, n):
        victims = self.lru_victims(n)
        assert len(victims) == min(n, self.idle())
        self.forget(self.ledger.evict(n), victims)

    @rule(data=st.data())
    def misuse_changes_nothing(self, data):
        ledger = self.ledger
        before = snapshot(ledger)
        unknown = self.next_owner + 1000
        calls = [
            (KeyError, lambda: ledger.grow(unknown, 1)),
            (KeyError, lambda: ledger.release(unknown)),
            (KeyError, lambda: ledger.table(unknown)),
            (ValueError, lambda: ledger.allocate(unknown, -1)),
            (ValueError, lambda: ledger.evict(-1)),
            (ValueError, lambda: ledger.blocks_needed(-3)),
        ]
        if self.tables:
            owner = data.draw(st.sampled_from(sorted(self.tables)))
            n = len(self.tokens[owner])
            calls += [
                (ValueError, lambda: ledger.allocate(owner, 1)),
                (ValueError, lambda: ledger.grow(owner, n - 1)),
                (ValueError, lambda: ledger.release(owner, [0] * (n + 1))),
            ]
        exc, call = data.draw(st.sampled_from(calls))
        with pytest.raises(exc):
            call()
        assert snapshot(ledger) == before

    @precondition(lambda self: len(self.cached) >= 3)  # rarely, and only once there is a cache
    @rule()
    def drain_all(self):
        """Releasing everyone and evicting everything restores the initial state."""
        for owner in list(self.tables):
            self.finish(owner, None)
        victims = self.lru_victims(N_BLOCKS)
        self.forget(self.ledger.evict(N_BLOCKS + 1), victims)
        self.check_pristine()

    def check_pristine(self) -> None:
        ledger = self.ledger
        s = ledger.stats
        assert (s.used, s.cached, s.free) == (0, 0, N_BLOCKS)
        assert list(ledger.cache_entries()) == [] and ledger.owners() == ()
        assert all(ledger.refcount(b) == 0 for b in range(N_BLOCKS))
        assert ledger.pop_evicted() == []
        assert ledger.can_allocate(N_BLOCKS * BS) and not ledger.can_allocate(N_BLOCKS * BS + 1)

    def teardown(self) -> None:
        self.drain_all()

    # ---- invariants ----------------------------------------------------------------------

    @invariant()
    def accounting_adds_up(self):
        s = self.ledger.stats
        referenced = self.referenced()
        assert s.total == N_BLOCKS
        assert s.used + s.cached + s.free == s.total
        assert s.used == len(referenced)
        assert s.cached == len(set(self.cached) - referenced)
        assert s.free == self.model_free()
        assert (s.queries, s.hits, s.hit_tokens, s.evictions) == tuple(self.counts.values())

    @invariant()
    def refcounts_match_tables_and_cache(self):
        ledger = self.ledger
        assert set(ledger.owners()) == set(self.tables)
        for owner, table in self.tables.items():
            assert list(ledger.table(owner)) == table
        for b in range(N_BLOCKS):
            expected = sum(t.count(b) for t in self.tables.values()) + (b in self.cached)
            assert ledger.refcount(b) == expected, f"block {b}"

    @invariant()
    def the_ledger_own_invariants_hold(self):
        self.ledger.check()  # free list, refcounts, chains and the idle count, as the ledger states them

    @invariant()
    def cache_is_consistent_and_hole_free(self):
        ledger = self.ledger
        assert {e.block for e in ledger.cache_entries()} == set(self.cached)
        prefixes = set()
        for b, holder in self.cached.items():
            entry = ledger.cache_entry(b)
            assert entry is not None and entry.holder == holder
            assert len(entry.tokens) == BS
            full = chain_tokens(ledger, b)  # asserts every ancestor is cached
            assert len(full) == entry.start + BS
            assert full == self.phys[b], "stored tokens differ from what the block holds"
            prefixes.add(full)
        assert len(prefixes) == len(self.cached), "the same prefix is cached twice"

    @invariant()
    def admission_boundary_is_exact(self):
        available = self.model_free() + self.idle()
        assert self.ledger.can_allocate(available * BS)
        assert not self.ledger.can_allocate(available * BS + 1)


def _colliding_hash(parent, tokens):
    # Ignores the parent and maps every block to one of three buckets.
    return sum(tokens) % 3


class CollidingHashMachine(LedgerMachine):
    hash_fn = staticmethod(_colliding_hash)


_machine_settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = _machine_settings
TestCollidingHashMachine = CollidingHashMachine.TestCase
TestCollidingHashMachine.settings = _machine_settings


# ---- focused unit tests --------------------------------------------------------------------


def finished_prompt(ledger: BlockLedger, owner: int, tokens, holder="h") -> range:
    ledger.allocate(owner, len(tokens), ledger.lookup(tokens))
    return ledger.release(owner, cache_tokens=tokens, holder=holder)


def test_admission_refused_exactly_when_blocks_do_not_fit():
    ledger = BlockLedger(4, 16)
    assert ledger.can_allocate(64) and not ledger.can_allocate(65)
    with pytest.raises(OutOfBlocks) as info:
        ledger.allocate(1, 65)
    assert (info.value.needed, info.value.available) == (5, 4)
    assert ledger.owners() == () and ledger.stats.free == 4
    ledger.allocate(1, 17)  # 2 blocks
    assert ledger.can_allocate(32) and not ledger.can_allocate(33)
    assert ledger.can_grow(1, 64) and not ledger.can_grow(1, 65)
    before = snapshot(ledger)
    with pytest.raises(OutOfBlocks):
        ledger.grow(1, 65)
    assert snapshot(ledger) == before
    assert ledger.grow(1, 32) == []  # still within its two blocks
    assert ledger.grow(1, 33) == [2]


def test_idle_cached_blocks_count_as_available_and_are_evicted_on_demand():
    ledger = BlockLedger(4, 4)
    finished_prompt(ledger, 1, list(range(9)), holder="seq1")  # caches 2 full blocks
    assert ledger.stats.cached == 2 and ledger.stats.free == 2
    assert ledger.can_allocate(16) and not ledger.can_allocate(17)
    table = ledger.allocate(2, 16)
    evicted = ledger.pop_evicted()
    assert [e.block for e in evicted] == [1, 0]  # leaf first, then its parent
    assert all(e.holder == "seq1" for e in evicted)
    assert set(table) == {0, 1, 2, 3}
    assert ledger.pop_evicted() == []  # drained


def test_matched_blocks_are_pinned_not_evicted_to_make_room():
    ledger = BlockLedger(3, 4)
    prompt = list(range(9))
    finished_prompt(ledger, 1, prompt)  # blocks 0, 1 cached; 1 free
    match = ledger.lookup(prompt)
    assert match.blocks == (0, 1)
    # The matched blocks cannot be both shared and evicted: only the free block is available.
    assert ledger.blocks_needed(9, match) == 1 and ledger.can_allocate(9, match)
    assert not ledger.can_allocate(13, match)
    with pytest.raises(OutOfBlocks):
        ledger.allocate(2, 13, match)
    assert ledger.allocate(2, 9, match) == [0, 1, 2]
    assert ledger.pop_evicted() == []


def test_a_match_is_pinned_even_when_it_is_the_least_recently_used():
    ledger = BlockLedger(4, 4)
    finished_prompt(ledger, 1, [1] * 5)  # caches block 0
    finished_prompt(ledger, 2, [2] * 5)  # caches block 1
    match = ledger.lookup([1] * 5)
    ledger.lookup([2] * 5)  # the scheduler peeked at another request: block 0 is now LRU
    table = ledger.allocate(3, 16, match)  # needs one eviction
    assert [e.block for e in ledger.pop_evicted()] == [1]
    assert table[0] == 0 and sorted(table) == [0, 1, 2, 3]


def test_lru_order_of_eviction():
    ledger = BlockLedger(8, 4)
    a, b, c = [1] * 5, [2] * 5, [3] * 5
    for owner, prompt in enumerate((a, b, c)):
        finished_prompt(ledger, owner, prompt, holder=owner)
    assert ledger.lookup(a + [9]).blocks  # a hit refreshes a: b is now the oldest
    assert [e.holder for e in ledger.evict(2)] == [1, 2]
    assert [e.holder for e in ledger.evict(5)] == [0]
    assert ledger.evict(1) == []


def test_eviction_takes_leaves_first_so_chains_have_no_holes():
    ledger = BlockLedger(8, 4)
    finished_prompt(ledger, 1, list(range(13)))  # chain 0 <- 1 <- 2
    finished_prompt(ledger, 2, [50] * 5)  # block 3, registered later
    # Block 0 is the least recently used, but it has cached children.
    assert [e.block for e in ledger.evict(2)] == [2, 1]
    assert ledger.lookup(list(range(13))).blocks == (0,)
    assert [e.block for e in ledger.evict(1)] == [3]  # the lookup refreshed block 0


def test_multi_turn_chat_extension_reuses_turn_one_blocks():
    ledger = BlockLedger(16, 16)
    turn1 = list(range(100, 137))  # 37 tokens: 2 full blocks + 5
    reply = list(range(500, 511))  # 11 tokens
    t1 = ledger.allocate(1, len(turn1), ledger.lookup(turn1))
    t1 += ledger.grow(1, len(turn1) + len(reply))
    kept = ledger.release(1, cache_tokens=turn1 + reply, holder="seq1")
    assert kept == range(0, 48)  # 48 tokens = 3 full blocks stay under seq1
    turn2 = turn1 + reply + list(range(900, 920))
    match = ledger.lookup(turn2)
    assert match.blocks == tuple(t1[:3]) and match.n_tokens == 48
    assert match.holders == ("seq1",) * 3
    table = ledger.allocate(2, len(turn2), match)
    assert table[:3] == t1[:3] and len(table) == math.ceil(len(turn2) / 16)
    assert all(ledger.refcount(b) == 2 for b in t1[:3])  # the cache and owner 2


def test_last_prompt_token_is_never_served_from_cache():
    ledger = BlockLedger(8, 4)
    finished_prompt(ledger, 1, list(range(12)))  # 3 full blocks cached
    assert ledger.lookup(list(range(12))).n_tokens == 8  # not 12: the last token is computed
    assert ledger.lookup(list(range(9))).n_tokens == 8
    assert ledger.lookup(list(range(8))).n_tokens == 4
    assert ledger.lookup(list(range(13))).n_tokens == 12
    assert ledger.lookup([0]).blocks == () and ledger.lookup([]).blocks == ()
    # allocate enforces the same rule for a hand-made or reused match.
    match = ledger.lookup(list(range(13)))
    with pytest.raises(ValueError):
        ledger.allocate(2, 12, match)


def test_stats_counters_move_as_expected():
    ledger = BlockLedger(6, 4)
    assert ledger.stats == type(ledger.stats)(6, 0, 0, 6, 0, 0, 0, 0)
    prompt = list(range(10))
    ledger.lookup(prompt)  # miss
    ledger.allocate(1, 10)
    s = ledger.stats
    assert (s.used, s.cached, s.free, s.queries, s.hits, s.hit_tokens) == (3, 0, 3, 1, 0, 0)
    ledger.release(1, cache_tokens=prompt, holder="a")
    s = ledger.stats
    assert (s.used, s.cached, s.free) == (0, 2, 4)
    match = ledger.lookup(prompt + [77])
    ledger.allocate(2, 11, match)
    s = ledger.stats
    assert (s.used, s.cached, s.free, s.queries, s.hits, s.hit_tokens) == (3, 0, 3, 2, 1, 8)
    ledger.release(2)
    assert ledger.evict(10) and ledger.stats.evictions == 2
    assert ledger.stats == type(ledger.stats)(6, 0, 0, 6, 2, 1, 8, 2)


def test_hash_collisions_never_produce_a_wrong_hit():
    ledger = BlockLedger(16, 4, hash_fn=lambda parent, tokens: 0)  # everything collides
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    finished_prompt(ledger, 1, a, holder="a")
    assert ledger.lookup([1, 2, 3, 5, 5, 6, 7, 8, 9]).blocks == ()  # same bucket, other tokens
    assert ledger.lookup([9, 9, 9, 9, 5, 6, 7, 8, 9]).blocks == ()  # block 1 only by prefix
    b = [9, 9, 9, 9, 5, 6, 7, 8, 9]
    finished_prompt(ledger, 2, b, holder="b")  # colliding entries coexist in one bucket
    assert ledger.lookup(a).holders == ("a", "a")
    assert ledger.lookup(b).holders == ("b", "b")
    assert ledger.lookup([1, 2, 3, 4, 0, 0, 0, 0, 0]).holders == ("a",)


def test_a_parent_blind_hash_does_not_match_content_at_another_prefix():
    ledger = BlockLedger(16, 4, hash_fn=lambda parent, tokens: hash(tokens))
    finished_prompt(ledger, 1, [1, 1, 1, 1, 2, 2, 2, 2, 0], holder="x")
    finished_prompt(ledger, 2, [3, 3, 3, 3, 5, 5, 5, 5, 0], holder="y")
    # Block (2, 2, 2, 2) is cached, but after (1, 1, 1, 1), not after (3, 3, 3, 3).
    assert ledger.lookup([3, 3, 3, 3, 2, 2, 2, 2, 0]).holders == ("y",)


def test_releasing_an_already_cached_prefix_does_not_duplicate_it():
    ledger = BlockLedger(8, 4)
    prompt = list(range(9))
    ledger.allocate(1, 9)  # both admitted before either finished: no sharing possible
    ledger.allocate(2, 9)
    assert ledger.release(1, cache_tokens=prompt, holder="one") == range(0, 8)
    assert len(ledger.release(2, cache_tokens=prompt, holder="two")) == 0
    assert len(list(ledger.cache_entries())) == 2 and ledger.stats.free == 6
    assert ledger.lookup(prompt).holders == ("one", "one")


def test_release_caches_new_blocks_after_a_shared_prefix():
    ledger = BlockLedger(8, 4)
    finished_prompt(ledger, 1, list(range(5)), holder="one")  # caches block 0
    longer = list(range(13))
    assert finished_prompt(ledger, 2, longer, holder="two") == range(4, 12)
    assert ledger.lookup(longer + [1]).holders == ("one", "two", "two")


def test_stale_match_is_refused_without_changing_state():
    ledger = BlockLedger(4, 4)
    prompt = list(range(9))
    finished_prompt(ledger, 1, prompt)
    match = ledger.lookup(prompt)
    ledger.evict(4)
    finished_prompt(ledger, 2, [7] * 9)  # the same block ids now hold other tokens
    before = snapshot(ledger)
    for call in (lambda: ledger.allocate(3, 9, match), lambda: ledger.can_allocate(9, match)):
        with pytest.raises(StaleMatch):
            call()
    forged = PrefixMatch(blocks=(0,), n_tokens=4)
    with pytest.raises(StaleMatch):
        ledger.allocate(3, 9, forged)
    assert snapshot(ledger) == before


def test_inconsistent_cache_tokens_are_refused_without_changing_state():
    ledger = BlockLedger(8, 4)
    prompt = list(range(9))
    finished_prompt(ledger, 1, prompt)
    ledger.allocate(2, 9, ledger.lookup(prompt))
    before = snapshot(ledger)
    with pytest.raises(ValueError):
        ledger.release(2, cache_tokens=[9] * 9)  # the shared blocks hold other tokens
    with pytest.raises(ValueError):
        ledger.release(2, cache_tokens=prompt + [0])  # more than the owner holds
    assert snapshot(ledger) == before


def test_misuse_raises_clear_errors():
    ledger = BlockLedger(4, 4)
    ledger.allocate(1, 4)
    before = snapshot(ledger)
    with pytest.raises(ValueError, match="already"):
        ledger.allocate(1, 4)
    with pytest.raises(KeyError, match="unknown owner"):
        ledger.grow(2, 4)
    with pytest.raises(KeyError, match="unknown owner"):
        ledger.release(2)
    with pytest.raises(ValueError):
        ledger.allocate(2, -1)
    with pytest.raises(ValueError, match="shrink"):
        ledger.grow(1, 3)
    assert snapshot(ledger) == before
    with pytest.raises(ValueError):
        BlockLedger(4, 0)


@settings(max_examples=60, deadline=None)
@given(
    n_blocks=st.integers(0, 6),
    block_size=st.integers(1, 5),
    sizes=st.lists(st.integers(0, 30), max_size=6),
)
def test_allocate_matches_can_allocate(n_blocks, block_size, sizes):
    ledger = BlockLedger(n_blocks, block_size)
    for owner, n in enumerate(sizes):
        fits = ledger.can_allocate(n)
        assert fits == (math.ceil(n / block_size) <= ledger.stats.free)
        if fits:
            assert len(ledger.allocate(owner, n)) == math.ceil(n / block_size)
        else:
            with pytest.raises(OutOfBlocks):
                ledger.allocate(owner, n)
