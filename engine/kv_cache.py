"""The KV cache as the scheduler sees it: block ledger + llama.cpp memory ops, kept in step.

Running sequences get seq ids from one pool. Finished (and preempted) sequences leave their
computed full blocks in the prefix cache: the cells are handed to a *holder* seq id from a second
pool, which nothing decodes, so they stay until the ledger evicts them. A new prompt that starts
with cached blocks gets those cells tagged with its own seq id by `seq_cp` — in the unified cache
that costs no copy and no extra cell — and prefills only the rest.

The cache is the one writer of `Sequence.n_computed`: it says how many of a sequence's tokens
are in llama.cpp's memory, and only the cache knows (after a lookup, a decode, a release).

What it keeps: one `SeqKv` record per sequence holding a seq id (running or suspended) and one
`HolderKv` per holder seq id in use, on top of the block ledger (engine/kv_blocks.py, which
states its own invariants in `BlockLedger.check`). Its invariants, checked by `check`:
- a record's seq id is the sequence's, no seq id is both free and recorded, no holder both free
  and in use;
- a sequence's first `shared_tokens` positions are holders' cells (tagged onto its seq id, never
  copied), the next `borrowed` were tagged from another live sequence's cells, the rest it
  computed itself, and `shared_tokens + borrowed <= n_computed`;
- its ledger table covers every computed token (`n_tokens(seq_id) >= n_computed`): a cell is
  reserved before llama_decode may fill it;
- a holder's cells are one run of positions ending at `end`, and it holds as many blocks as the
  ledger's cache entries that name it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Protocol

from engine.ownership import SingleWriter
from engine.kv_blocks import BlockLedger, CachedBlock, LedgerStats, PrefixMatch
from engine.prefix_reuse import PrefixReuse
from engine.tuning import IDLE_CELLS_PER_PROMPT_TOKEN_FLASH
from engine.sequence import Sequence

log = logging.getLogger("cobatch.engine")


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


@dataclass
class SeqKv:
    """What the cache holds for one sequence that has a seq id."""

    seq: Sequence
    seq_id: int
    shared_tokens: int  # leading positions whose cells are holders' (cached blocks, tagged onto seq_id)
    shared_blocks: tuple[int, ...]  # the cached blocks those positions are
    borrowed: int = 0  # positions after those, tagged from another live sequence's cells at admission

    @property
    def own_tokens(self) -> int:
        """Cells counted as this sequence's own (the shared ones are counted under their holders)."""
        return max(0, self.seq.n_computed - self.shared_tokens)


@dataclass
class HolderKv:
    """A holder seq id: cached cells nothing decodes, kept for later prompts that start the same."""

    blocks: int  # cached blocks it still holds
    end: int  # the position after its last cell: a holder grows and shrinks only at its end


class KvCache(SingleWriter):
    """Engine thread only."""

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
        self.reuse = reuse or PrefixReuse(IDLE_CELLS_PER_PROMPT_TOKEN_FLASH)
        self.idle_drops = 0
        self.lost_shares = 0  # cache hits whose cells llama.cpp had reused (_admit_afresh)
        self.block_size = block_size
        self.prefix_cache = prefix_cache and len(holder_ids) > 0
        self.ledger: BlockLedger[int] = BlockLedger(n_cells // block_size, block_size)
        self._free_ids = list(reversed(running_ids))
        self._free_holders = list(reversed(holder_ids))
        self._records: dict[int, SeqKv] = {}  # seq id -> its sequence's record
        self._holders: dict[int, HolderKv] = {}  # holder seq id -> what it holds

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
        record = self._register(seq, seq_id, match.n_tokens if match is not None else 0,
                                match.blocks if match is not None else ())
        if reuse:
            record.borrowed = self._borrow(seq)
            seq.n_computed += record.borrowed
            if seq.n_computed and self._memory.seq_pos_max(seq_id) != seq.n_computed - 1:
                return self._admit_afresh(seq, n_tokens)
        if seq.cached_tokens is None:
            seq.cached_tokens = seq.n_computed
        if reuse:
            self.reuse.observe(len(seq.tokens), seq.n_computed)
        self._weigh_idle()
        return True

    def _admit_afresh(self, seq: Sequence, n_tokens: int) -> bool:
        """The cells a cache hit shared do not reach where the ledger says: llama.cpp reused some
        of them for other tokens (a sliding-window layer's cache, Gemma 3's, takes a cell only one
        sequence tags once it is a window behind that sequence's last position, and a holder's
        oldest cells are). Forget every idle cached block and admit `seq` with nothing shared."""
        record = self._record(seq)
        log.warning("prefix cache: llama.cpp holds seq %d's shared cells up to %d, not %d; the idle cache is "
                    "dropped and the prompt computed afresh", record.seq_id,
                    self._memory.seq_pos_max(record.seq_id), seq.n_computed - 1)
        self.ledger.release(record.seq_id)
        self._memory.seq_rm(record.seq_id, -1, -1)
        self._free_ids.append(record.seq_id)
        del self._records[record.seq_id]
        seq.seq_id, seq.n_computed = None, 0
        self.lost_shares += 1
        self._drop_evicted(self.ledger.evict(self.ledger.stats.cached))
        if not self.ledger.can_allocate(n_tokens, None):
            return False
        self._register(seq, self._allocate(n_tokens, None), 0, ())
        if seq.cached_tokens is None:
            seq.cached_tokens = 0
        self.reuse.observe(len(seq.tokens), 0)
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

    def try_reserve(self, seq: Sequence, n_tokens_total: int) -> bool:
        """Make sure seq's blocks cover n_tokens_total tokens (evicting idle cached blocks)."""
        seq_id = self._record(seq).seq_id
        if n_tokens_total <= self.ledger.n_tokens(seq_id):
            return True
        if not self.ledger.can_grow(seq_id, n_tokens_total):
            return False
        self.ledger.grow(seq_id, n_tokens_total)
        self._drop_evicted(self.ledger.pop_evicted())
        return True

    def computed(self, seq: Sequence, n_tokens: int) -> None:
        """llama_decode has put the next n_tokens of seq into its cells."""
        self._record(seq)
        assert seq.n_computed + n_tokens <= len(seq.tokens)
        seq.n_computed += n_tokens
        if self.prefix_cache and seq.n_computed - n_tokens < seq.n_prompt <= seq.n_computed:
            self._publish_prompt(seq)

    def drop_uncomputed(self, seq: Sequence) -> None:
        """Cells past seq's computed tokens (drafted tokens the model did not confirm) leave
        llama.cpp's memory, and the blocks reserved past its tokens return to the ledger."""
        record = self._record(seq)
        self._memory.seq_rm(record.seq_id, seq.n_computed, -1)
        if len(seq.tokens) < self.ledger.n_tokens(record.seq_id):
            self.ledger.shrink(record.seq_id, len(seq.tokens))

    def release(self, seq: Sequence) -> None:
        """Free seq's id and blocks; its computed full blocks may stay behind as cached prefix.

        The cells are removed from llama.cpp before the id can be handed out again.
        """
        record = self._record(seq)
        seq_id = record.seq_id
        tokens = seq.tokens[: seq.n_computed]
        holder = None
        if self.prefix_cache:
            holder = self._holder_after(*self.ledger.caching_start(seq_id, tokens, publishing=False))
        if holder is None:
            self.ledger.release(seq_id)
        else:
            self._hold(seq_id, holder, self.ledger.release(seq_id, tokens, holder=holder))
        self._memory.seq_rm(seq_id, -1, -1)
        self._free_ids.append(seq_id)
        del self._records[seq_id]
        seq.seq_id = None
        seq.n_computed = 0
        if self.max_cached_blocks is not None:
            excess = self.ledger.stats.cached - self.max_cached_blocks
            if excess > 0:
                self._drop_evicted(self.ledger.evict(excess))
        self._weigh_idle()

    # ---- what it measures -----------------------------------------------------------------------
    def cells_in_use(self, memory: KvPositions) -> int:
        """Distinct llama.cpp cells in use, read from seq_pos_min/max, not from the ledger.

        A running sequence's leading positions that were shared from a holder are the holder's
        cells (seq_cp only tagged them), so they are counted once, under the holder.
        """
        cells = 0
        for holder in self._holders:
            lo, hi = memory.seq_pos_min(holder), memory.seq_pos_max(holder)
            cells += hi - lo + 1 if hi >= 0 else 0
        for seq_id, record in self._records.items():
            hi = memory.seq_pos_max(seq_id)
            cells += max(0, hi + 1 - record.shared_tokens)
        return cells

    def cells_held(self) -> int:
        """Distinct cells holding the tokens of sequences that have a seq id (running or
        suspended): a cached prefix shared by several counts once, idle cached blocks not at all;
        borrowed cells count under both sequences that tag them."""
        shared: set[int] = set().union(*(r.shared_blocks for r in self._records.values()))
        return len(shared) * self.block_size + sum(r.own_tokens for r in self._records.values())

    def stats(self) -> KvCacheStats:
        s: LedgerStats = self.ledger.stats
        return KvCacheStats(s.total, s.used, s.cached, s.free, self.block_size, s.queries, s.hits,
                            s.hit_tokens, s.evictions, round(self.reuse.share, 4), self.idle_drops)

    def check(self) -> None:
        """Raise AssertionError unless the invariants in the module docstring hold."""
        self.ledger.check()
        assert not set(self._free_ids) & set(self._records), "a recorded seq id is also free"
        assert not set(self._free_holders) & set(self._holders), "a holder in use is also free"
        for seq_id, record in self._records.items():
            seq = record.seq
            assert record.seq_id == seq_id == seq.seq_id, f"seq id {seq_id} recorded for {seq.seq_id}"
            assert record.shared_tokens + record.borrowed <= seq.n_computed, f"seq {seq_id} shares uncomputed cells"
            assert self.ledger.n_tokens(seq_id) >= seq.n_computed, \
                f"seq {seq_id} computed {seq.n_computed} tokens, its blocks cover {self.ledger.n_tokens(seq_id)}"
        blocks: dict[int, list[int]] = {}
        for entry in self.ledger.cache_entries():
            blocks.setdefault(entry.holder, []).append(entry.start)
        assert set(blocks) == set(self._holders), "holders in use differ from the cache entries' holders"
        for holder, starts in blocks.items():
            state = self._holders[holder]
            assert state.blocks == len(starts), f"holder {holder} counts {state.blocks} blocks, holds {len(starts)}"
            assert state.end == max(starts) + self.block_size, f"holder {holder} ends at {state.end}"

    # ---- internals ------------------------------------------------------------------------------
    def _record(self, seq: Sequence) -> SeqKv:
        assert seq.seq_id is not None and self._records[seq.seq_id].seq is seq, f"{seq.seq_id} is not seq's id"
        return self._records[seq.seq_id]

    def _allocate(self, n_tokens: int, match: PrefixMatch[int] | None) -> int:
        """A seq id and blocks for n_tokens (the caller checked there is room)."""
        seq_id = self._free_ids.pop()
        self.ledger.allocate(seq_id, n_tokens, match)
        self._drop_evicted(self.ledger.pop_evicted())
        return seq_id

    def _register(self, seq: Sequence, seq_id: int, shared_tokens: int, shared_blocks: tuple[int, ...]) -> SeqKv:
        """seq owns seq_id; its first shared_tokens are in holders' cells (shared_blocks)."""
        seq.seq_id = seq_id
        seq.n_computed = shared_tokens
        record = self._records[seq_id] = SeqKv(seq, seq_id, shared_tokens, shared_blocks)
        return record

    def _weigh_idle(self) -> None:
        """Drop every idle cached block if the prompt tokens still to prefill would pay more for
        them than their measured reuse is worth (checked when a prompt arrives and when a finished
        sequence leaves idle blocks behind)."""
        idle = self.ledger.stats.cached
        if not idle:
            return
        fresh = sum(len(r.seq.tokens) - r.seq.n_computed for r in self._records.values())
        if not self.reuse.keep_idle(fresh):
            self._drop_evicted(self.ledger.evict(idle))
            self.idle_drops += 1

    def _borrow(self, seq: Sequence) -> int:
        """Tag cells a live sequence computed for the same tokens, past the cached blocks, with
        seq's id too (token-granular: the partial block at a shared prompt's end, or blocks not
        published yet); returns how many. seq's own blocks already reserve room for them, so the
        ledger stays safe whoever finishes first."""
        start, limit = seq.n_computed, len(seq.tokens) - 1  # the last token is always computed
        best, donor = 0, None
        for record in self._records.values():
            other = record.seq
            n = min(other.n_computed, limit)
            if other is seq or n <= start + best or other.tokens[:start] != seq.tokens[:start]:
                continue
            common = start
            while common < n and other.tokens[common] == seq.tokens[common]:
                common += 1
            if common - start > best:
                best, donor = common - start, record
        if donor is not None:
            self._memory.seq_cp(donor.seq_id, self._record(seq).seq_id, start, start + best)
        return best

    def _publish_prompt(self, seq: Sequence) -> None:
        # A prompt's blocks are shareable as soon as they are computed, not only once the
        # sequence ends: requests that arrived with it can start from them a step later.
        record = self._record(seq)
        tokens = seq.tokens[: seq.n_prompt]
        holder = self._holder_after(*self.ledger.caching_start(record.seq_id, tokens, publishing=True))
        if holder is None:
            return
        kept = self.ledger.publish(record.seq_id, tokens, holder)
        if not self._hold(record.seq_id, holder, kept):
            return
        if kept.start <= record.shared_tokens:
            # Its leading cells are all holders' now: count them once, under the holders.
            borrowed_end = record.shared_tokens + record.borrowed
            record.shared_tokens = kept.stop
            record.shared_blocks = self.ledger.table(record.seq_id)[: kept.stop // self.block_size]
            record.borrowed = max(0, borrowed_end - kept.stop)

    def _holder_after(self, start: int, before: int | None) -> int | None:
        """A holder for cells cached from position `start` on: the holder of the block just before,
        if its cells end there (so a conversation's turns pile up under one holder instead of
        taking two each, which ran the holders out and evicted live conversations), else a
        free one."""
        if before is not None and before in self._holders and self._holders[before].end == start:
            return before
        return self._take_holder()

    def _hold(self, seq_id: int, holder: int, kept: range) -> bool:
        """Tag seq_id's cells at the `kept` positions with `holder`; False if there were none (a
        fresh holder then goes back to the free list)."""
        if not len(kept):
            if holder not in self._holders:
                self._free_holders.append(holder)
            return False
        state = self._holders.get(holder)
        # A holder only grows at its end: its positions stay one run (cells_in_use relies on it).
        assert state is None or state.end == kept.start
        self._memory.seq_cp(seq_id, holder, kept.start, kept.stop)
        if state is None:
            state = self._holders[holder] = HolderKv(0, kept.start)
        state.blocks += len(kept) // self.block_size
        state.end = kept.stop
        return True

    def _take_holder(self) -> int | None:
        # Holders are fewer than blocks: when all are busy, evict least recently used cached
        # blocks until one holder is empty, so the newest prefixes can still be kept.
        while not self._free_holders and self.ledger.stats.cached > 0:
            self._drop_evicted(self.ledger.evict(1))
        return self._free_holders.pop() if self._free_holders else None

    def _share(self, holders: tuple[int, ...], seq_id: int) -> None:
        # One seq_cp per run of consecutive blocks living under the same holder.
        bs, start = self.block_size, 0
        for i in range(1, len(holders) + 1):
            if i == len(holders) or holders[i] != holders[start]:
                self._memory.seq_cp(holders[start], seq_id, start * bs, i * bs)
                start = i

    def _drop_evicted(self, evicted: list[CachedBlock[int]]) -> None:
        for entry in evicted:
            holder, state = entry.holder, self._holders[entry.holder]
            self._memory.seq_rm(holder, entry.start, entry.start + self.block_size)
            state.blocks -= 1
            if state.blocks == 0:
                del self._holders[holder]
                self._memory.seq_rm(holder, -1, -1)
                self._free_holders.append(holder)
            elif state.end == entry.start + self.block_size:
                state.end = entry.start  # leaves go first: a holder shrinks from its end
