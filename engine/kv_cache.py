"""The KV cache as the scheduler sees it: block ledger + llama.cpp memory ops, kept in step.

Running sequences get seq ids from one pool. Finished (and preempted) sequences leave their
computed full blocks in the prefix cache: the cells are handed to a *holder* seq id from a second
pool, which nothing decodes, so they stay until the ledger evicts them. A new prompt that starts
with cached blocks gets those cells tagged with its own seq id by `seq_cp` — in the unified cache
that costs no copy and no extra cell — and prefills only the rest.

The cache is the one writer of `Sequence.n_computed`: it says how many of a sequence's tokens
are in llama.cpp's memory, and only the cache knows (after a lookup, a decode, a release).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from engine.kv_blocks import BlockLedger, CachedBlock, LedgerStats, PrefixMatch
from engine.prefix_reuse import PrefixReuse
from engine.sequence import Sequence


class KvMemory(Protocol):
    """The llama.cpp memory operations the cache needs (positions: p0 inclusive, p1 exclusive)."""

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...


class KvPositions(Protocol):
    def seq_pos_min(self, seq_id: int) -> int: ...

    def seq_pos_max(self, seq_id: int) -> int: ...


@dataclass(frozen=True)
class KvCacheStats:
    blocks_total: int
    blocks_used: int  # held by running sequences
    blocks_cached: int  # held only by the prefix cache
    blocks_free: int
    block_size: int
    prefix_lookups: int
    prefix_hits: int
    prefix_hit_tokens: int
    evictions: int
    reuse_share: float  # decayed share of recent prompt tokens served from the cache
    idle_drops: int  # times idle cached prefixes were dropped before a long prefill


class KvCache:
    def __init__(
        self,
        memory: KvMemory,
        n_cells: int,
        block_size: int,
        running_ids: range,
        holder_ids: range,
        prefix_cache: bool = True,
        max_cached_blocks: int | None = None,
        reuse: PrefixReuse | None = None,
    ) -> None:
        self._memory = memory
        # Idle cached blocks still hold cells, and llama.cpp's attention spans the used cells
        # of the whole unified cache: past this many, the least recently used are dropped.
        self.max_cached_blocks = max_cached_blocks
        self.reuse = reuse or PrefixReuse()
        self.idle_drops = 0
        self.block_size = block_size
        self.prefix_cache = prefix_cache and len(holder_ids) > 0
        self.ledger = BlockLedger(n_cells // block_size, block_size)
        self._free_ids = list(reversed(running_ids))
        self._free_holders = list(reversed(holder_ids))
        self._holder_blocks: dict[int, int] = {}  # holder seq id -> cached blocks it still holds
        self._holder_end: dict[int, int] = {}  # holder seq id -> the position after its last cell
        self._shared: dict[int, int] = {}  # running seq id -> leading positions shared from holders
        self._owners: dict[int, Sequence] = {}  # seq id -> the sequence holding it
        self._shared_blocks: dict[int, tuple[int, ...]] = {}  # seq id -> cached blocks it shares

    @property
    def n_free_ids(self) -> int:
        return len(self._free_ids)

    def try_admit(self, seq: Sequence) -> bool:
        """Give `seq` a seq id and blocks for all its tokens, reusing cached leading blocks.

        On success seq.n_computed counts the tokens served from the cache. On failure nothing
        changed (the lookup still counts as a prefix-cache query).
        """
        if not self._free_ids:
            return False
        n_tokens = len(seq.tokens)
        if n_tokens > self.ledger.n_blocks * self.block_size:
            return False
        reuse = self.prefix_cache and not seq.scores_prompt  # a scored prompt's rows must all be computed
        match = self.ledger.lookup(seq.tokens) if reuse else None
        if not self.ledger.can_allocate(n_tokens, match):
            return False
        seq_id = self._allocate(n_tokens, match)
        if match is not None and match.blocks:
            self._share(match.holders, seq_id)
        shared = match.n_tokens if match is not None else 0
        self._register(seq, seq_id, shared, match.blocks if match is not None else ())
        if reuse:
            seq.n_computed += self._borrow(seq)
        if seq.cached_tokens is None:
            seq.cached_tokens = seq.n_computed
        if reuse:
            self.reuse.observe(len(seq.tokens), seq.n_computed)
        self._weigh_idle()
        return True

    def adopt(self, seq: Sequence, import_cells: Callable[[int], bool]) -> bool:
        """Give `seq` a seq id and blocks, and its prompt's cells through `import_cells(seq_id)`
        (computed in another context: its own cells, nothing shared). False, with nothing changed,
        if there is no room in the ledger or llama.cpp's memory."""
        n_tokens = len(seq.tokens)
        if not self._free_ids or not self.ledger.can_allocate(n_tokens, None):
            return False
        seq_id = self._allocate(n_tokens, None)
        if not import_cells(seq_id):
            self.ledger.release(seq_id)
            self._free_ids.append(seq_id)
            return False
        self._register(seq, seq_id, 0, ())
        if seq.cached_tokens is None:
            seq.cached_tokens = 0
        self.computed(seq, seq.n_prompt)  # its prompt blocks join the prefix cache as if computed here
        return True

    def _allocate(self, n_tokens: int, match: PrefixMatch | None) -> int:
        """A seq id and blocks for n_tokens (the caller checked there is room)."""
        seq_id = self._free_ids.pop()
        self.ledger.allocate(seq_id, n_tokens, match)
        self._drop_evicted(self.ledger.pop_evicted())
        return seq_id

    def _register(self, seq: Sequence, seq_id: int, shared_tokens: int, shared_blocks: tuple[int, ...]) -> None:
        """seq owns seq_id; its first shared_tokens are in holders' cells (shared_blocks)."""
        seq.seq_id = seq_id
        seq.n_computed = shared_tokens
        self._shared[seq_id] = shared_tokens
        self._shared_blocks[seq_id] = shared_blocks
        self._owners[seq_id] = seq

    def _weigh_idle(self) -> None:
        """Drop every idle cached block if the prompt tokens still to prefill would pay more for
        them than their measured reuse is worth (checked when a prompt arrives and when a finished
        sequence leaves idle blocks behind)."""
        idle = self.ledger.stats.cached
        if not idle:
            return
        fresh = sum(len(seq.tokens) - seq.n_computed for seq in self._owners.values())
        if not self.reuse.keep_idle(fresh):
            self._drop_evicted(self.ledger.evict(idle))
            self.idle_drops += 1

    def _borrow(self, seq: Sequence) -> int:
        """Tag cells a live sequence computed for the same tokens, past the cached blocks, with
        seq's id too (token-granular: the partial block at a shared prompt's end, or blocks not
        published yet); returns how many. seq's own blocks already reserve room for them, so the
        ledger stays safe whoever finishes first; cells_held counts them under both."""
        start, limit = seq.n_computed, len(seq.tokens) - 1  # the last token is always computed
        best, donor = 0, None
        for other in self._owners.values():
            n = min(other.n_computed, limit)
            if n <= start + best or other.tokens[:start] != seq.tokens[:start]:
                continue
            common = start
            while common < n and other.tokens[common] == seq.tokens[common]:
                common += 1
            if common - start > best:
                best, donor = common - start, other
        if donor is not None:
            self._memory.seq_cp(donor.seq_id, seq.seq_id, start, start + best)  # type: ignore[arg-type]
        return best

    def try_reserve(self, seq: Sequence, n_tokens_total: int) -> bool:
        """Make sure seq's blocks cover n_tokens_total tokens (evicting idle cached blocks)."""
        assert seq.seq_id is not None
        if n_tokens_total <= self.ledger.n_tokens(seq.seq_id):
            return True
        if not self.ledger.can_grow(seq.seq_id, n_tokens_total):
            return False
        self.ledger.grow(seq.seq_id, n_tokens_total)
        self._drop_evicted(self.ledger.pop_evicted())
        return True

    def computed(self, seq: Sequence, n_tokens: int) -> None:
        """llama_decode has put the next n_tokens of seq into its cells."""
        assert seq.seq_id is not None and seq.n_computed + n_tokens <= len(seq.tokens)
        seq.n_computed += n_tokens
        if self.prefix_cache and seq.n_computed - n_tokens < seq.n_prompt <= seq.n_computed:
            self._publish_prompt(seq)

    def _publish_prompt(self, seq: Sequence) -> None:
        # A prompt's blocks are shareable as soon as they are computed, not only once the
        # sequence ends: requests that arrived with it can start from them a step later.
        seq_id = seq.seq_id
        tokens = seq.tokens[: seq.n_prompt]
        holder = self._holder_after(*self.ledger.caching_start(seq_id, tokens, publishing=True))
        if holder is None:
            return
        kept = self.ledger.publish(seq_id, tokens, holder)
        if not self._hold(seq_id, holder, kept):
            return
        if kept.start <= self._shared[seq_id]:
            # Its leading cells are all holders' now: count them once, under the holders.
            self._shared[seq_id] = kept.stop
            self._shared_blocks[seq_id] = self.ledger.table(seq_id)[: kept.stop // self.block_size]

    def release(self, seq: Sequence, keep_prefix: bool = True) -> None:
        """Free seq's id and blocks; its computed full blocks may stay behind as cached prefix.

        The cells are removed from llama.cpp before the id can be handed out again.
        """
        seq_id = seq.seq_id
        assert seq_id is not None
        tokens = seq.tokens[: seq.n_computed]
        holder = None
        if keep_prefix and self.prefix_cache:
            holder = self._holder_after(*self.ledger.caching_start(seq_id, tokens, publishing=False))
        if holder is None:
            self.ledger.release(seq_id)
        else:
            self._hold(seq_id, holder, self.ledger.release(seq_id, tokens, holder=holder))
        self._memory.seq_rm(seq_id, -1, -1)
        self._free_ids.append(seq_id)
        del self._shared[seq_id]
        del self._owners[seq_id]
        del self._shared_blocks[seq_id]
        seq.seq_id = None
        seq.n_computed = 0
        if self.max_cached_blocks is not None:
            excess = self.ledger.stats.cached - self.max_cached_blocks
            if excess > 0:
                self._drop_evicted(self.ledger.evict(excess))
        self._weigh_idle()

    def cells_in_use(self, memory: "KvPositions") -> int:
        """Distinct llama.cpp cells in use, read from seq_pos_min/max, not from the ledger.

        A running sequence's leading positions that were shared from a holder are the holder's
        cells (seq_cp only tagged them), so they are counted once, under the holder.
        """
        cells = 0
        for holder in self._holder_blocks:
            lo, hi = memory.seq_pos_min(holder), memory.seq_pos_max(holder)
            cells += hi - lo + 1 if hi >= 0 else 0
        for seq_id, shared in self._shared.items():
            hi = memory.seq_pos_max(seq_id)
            cells += max(0, hi + 1 - shared)
        return cells

    def cells_held(self) -> int:
        """Distinct cells holding the tokens of sequences that have a seq id (running or
        suspended): a cached prefix shared by several counts once, idle cached blocks not at all."""
        shared: set[int] = set().union(*self._shared_blocks.values())
        own = sum(max(0, seq.n_computed - self._shared[i]) for i, seq in self._owners.items())
        return len(shared) * self.block_size + own

    def stats(self) -> KvCacheStats:
        s: LedgerStats = self.ledger.stats
        return KvCacheStats(s.total, s.used, s.cached, s.free, self.block_size, s.queries, s.hits,
                            s.hit_tokens, s.evictions, round(self.reuse.share, 4), self.idle_drops)

    def _holder_after(self, start: int, before: object) -> int | None:
        """A holder for cells cached from position `start` on: the holder of the block just before,
        if its cells end there (so a conversation's turns pile up under one holder instead of
        taking two each, which ran the holders out and evicted live conversations), else a
        free one."""
        if isinstance(before, int) and self._holder_end.get(before) == start:
            return before
        return self._take_holder()

    def _hold(self, seq_id: int, holder: int, kept: range) -> bool:
        """Tag seq_id's cells at the `kept` positions with `holder`; False if there were none (a
        fresh holder then goes back to the free list)."""
        if not len(kept):
            if holder not in self._holder_blocks:
                self._free_holders.append(holder)
            return False
        # A holder only grows at its end: its positions stay one run (cells_in_use relies on it).
        assert holder not in self._holder_end or self._holder_end[holder] == kept.start
        self._memory.seq_cp(seq_id, holder, kept.start, kept.stop)
        self._holder_blocks[holder] = self._holder_blocks.get(holder, 0) + len(kept) // self.block_size
        self._holder_end[holder] = kept.stop
        return True

    def _take_holder(self) -> int | None:
        # Holders are fewer than blocks: when all are busy, evict least recently used cached
        # blocks until one holder is empty, so the newest prefixes can still be kept.
        while not self._free_holders and self.ledger.stats.cached > 0:
            self._drop_evicted(self.ledger.evict(1))
        return self._free_holders.pop() if self._free_holders else None

    def _share(self, holders: tuple[object, ...], seq_id: int) -> None:
        # One seq_cp per run of consecutive blocks living under the same holder.
        bs, start = self.block_size, 0
        for i in range(1, len(holders) + 1):
            if i == len(holders) or holders[i] != holders[start]:
                self._memory.seq_cp(int(holders[start]), seq_id, start * bs, i * bs)  # type: ignore[arg-type]
                start = i

    def _drop_evicted(self, evicted: list[CachedBlock]) -> None:
        for entry in evicted:
            holder = int(entry.holder)  # type: ignore[arg-type]
            self._memory.seq_rm(holder, entry.start, entry.start + self.block_size)
            self._holder_blocks[holder] -= 1
            if self._holder_blocks[holder] == 0:
                del self._holder_blocks[holder], self._holder_end[holder]
                self._memory.seq_rm(holder, -1, -1)
                self._free_holders.append(holder)
            elif self._holder_end[holder] == entry.start + self.block_size:
                self._holder_end[holder] = entry.start  # leaves go first: a holder shrinks from its end
