"""Random operations through KvCache against the real llama.cpp memory: after every step, what the
ledger says each seq id holds must be what llama_memory_seq_pos_min/max report."""
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bindings import TokenBatch, Context, ContextSettings, DecodeOutcome, Model
from engine.kv_cache import KvCache
from engine.model_source import default_model_path

pytestmark = pytest.mark.model

BLOCK = 16
RUNNING, HOLDERS = range(0, 3), range(3, 6)
N_CTX = 256


@dataclass
class Seq:
    tokens: list[int]
    n_computed: int = 0
    seq_id: int | None = None
    cached_tokens: int | None = None
    fed: list[int] = field(default_factory=list)
    n_prompt: int = 0
    scores_prompt: bool = False  # a scored prompt takes nothing from the cache (test_prompt_logprobs.py)

    def __post_init__(self) -> None:
        self.n_prompt = len(self.tokens)  # computing past it publishes the prompt's blocks


@pytest.fixture(scope="module")
def model():
    with Model(default_model_path()) as m:
        yield m


class KvCacheAgainstLlamaMemory(RuleBasedStateMachine):
    model: Model = None  # set by the test

    @initialize()
    def setup(self):
        base = self.model.tokenize("In the beginning the universe was created. " * 6)[:64]
        self.pool = [base[:n] + [236743 + i] * 5 for i, n in enumerate((20, 33, 48, 64))]
        self.ctx = Context(self.model, ContextSettings(
            n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_seq_max=6, n_threads=2, swa_full=True))
        self.kv = KvCache(self.ctx, N_CTX, BLOCK, RUNNING, HOLDERS)
        # Where the first-token lane computes a prompt before the cache adopts its cells.
        self.side = Context(self.model, ContextSettings(
            n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_seq_max=1, n_threads=1, swa_full=True))
        self.batch = TokenBatch(N_CTX)
        self.running: list[Seq] = []

    def teardown(self):
        if hasattr(self, "ctx"):
            self.ctx.close()
            self.side.close()

    def _compute(self, seq: Seq) -> None:
        todo = seq.tokens[seq.n_computed:]
        if not todo:
            return
        self.batch.clear()
        self.batch.add_run(np.asarray(todo, dtype=np.int32), seq.n_computed, seq.seq_id, True)
        assert self.ctx.decode(self.batch) is DecodeOutcome.OK
        self.kv.computed(seq, len(todo))

    @rule(which=st.integers(0, 3), extra=st.integers(0, 20))
    def admit(self, which, extra):
        seq = Seq(list(self.pool[which]) + list(range(300, 300 + extra)))
        if self.kv.try_admit(seq):
            # Cached full blocks, then maybe cells borrowed from a running sequence's same tokens.
            assert seq.n_computed < len(seq.tokens)
            self.running.append(seq)
            self._compute(seq)

    @rule(which=st.integers(0, 3), extra=st.integers(0, 20))
    def adopt(self, which, extra):
        """A prompt computed in another context, then adopted with its first token pending."""
        seq = Seq(list(self.pool[which]) + list(range(300, 300 + extra)) + [777])
        seq.n_prompt -= 1
        self.batch.clear()
        self.batch.add_run(np.asarray(seq.tokens[: seq.n_prompt], dtype=np.int32), 0, 0, True)
        assert self.side.decode(self.batch) is DecodeOutcome.OK
        cells = self.side.export_sequence(0)
        self.side.seq_rm(0)
        if self.kv.adopt(seq, lambda seq_id: self.ctx.import_sequence(seq_id, cells)):
            assert seq.n_computed == seq.n_prompt and seq.cached_tokens == 0
            self.running.append(seq)
            self._compute(seq)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 10), n=st.integers(1, 24))
    def grow(self, i, n):
        seq = self.running[i % len(self.running)]
        if self.kv.try_reserve(seq, len(seq.tokens) + n):
            seq.tokens += list(range(500, 500 + n))
            self._compute(seq)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 10), k=st.integers(1, 12), data=st.data())
    def speculate(self, i, k, data):
        """k drafted tokens are computed after the sequence's tokens, the model keeps the first j
        and appends one token of its own (pending): the other drafted cells must go."""
        seq = self.running[i % len(self.running)]
        # Reserved first, as the scheduler reserves every running sequence's tokens before a step:
        # computing a token left pending by an earlier verification needs its block too.
        if not self.kv.try_reserve(seq, len(seq.tokens) + k):
            return
        self._compute(seq)
        draft = list(range(600, 600 + k))
        self.batch.clear()
        self.batch.add_run(np.asarray(draft, dtype=np.int32), len(seq.tokens), seq.seq_id, True, n_logits=k)
        assert self.ctx.decode(self.batch) is DecodeOutcome.OK
        j = data.draw(st.integers(0, k))
        seq.tokens += draft[:j]
        self.kv.computed(seq, j)
        seq.tokens.append(700)
        self.kv.drop_uncomputed(seq)
        assert seq.n_computed <= self.kv.ledger.n_tokens(seq.seq_id) <= len(seq.tokens)  # no block beyond its tokens

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 10))
    def finish(self, i):
        self.kv.release(self.running.pop(i % len(self.running)))

    @rule(n=st.integers(1, 4))
    def evict(self, n):
        self.kv._drop_evicted(self.kv.ledger.evict(n))

    @invariant()
    def memory_matches_ledger(self):
        if not hasattr(self, "kv"):
            return
        by_id = {s.seq_id: s for s in self.running}
        for sid in RUNNING:
            lo, hi = self.ctx.seq_pos_min(sid), self.ctx.seq_pos_max(sid)
            if sid in by_id:
                assert (lo, hi) == (0, by_id[sid].n_computed - 1), f"running seq {sid}"
            else:
                assert (lo, hi) == (-1, -1), f"free seq id {sid} still holds cells"
        held: dict[int, list[int]] = {}
        for entry in self.kv.ledger.cache_entries():
            held.setdefault(entry.holder, []).append(entry.start)
        for hid in HOLDERS:
            lo, hi = self.ctx.seq_pos_min(hid), self.ctx.seq_pos_max(hid)
            starts = held.get(hid)
            expected = (-1, -1) if not starts else (min(starts), max(starts) + BLOCK - 1)
            assert (lo, hi) == expected, f"holder {hid}"
        s = self.kv.ledger.stats
        assert s.used + s.cached + s.free == s.total
        self.kv.check()


def test_kv_cache_matches_llama_memory(model):
    KvCacheAgainstLlamaMemory.model = model
    machine = KvCacheAgainstLlamaMemory.TestCase
    machine.settings = settings(max_examples=12, stateful_step_count=20, deadline=None,
                                suppress_health_check=list(HealthCheck))
    machine().runTest()


def test_a_hit_whose_cells_llama_cpp_reused_is_computed_afresh_and_the_idle_cache_forgotten(model):
    # Gemma 3's sliding-window layers let llama.cpp take a cell that only one sequence tags once
    # it is a window behind that sequence's last position: a holder's oldest cells can go. Here
    # the holder loses its last block's cells; the ledger still lists the block.
    with Context(model, ContextSettings(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_seq_max=6, n_threads=2,
                                        swa_full=True)) as ctx:
        kv = KvCache(ctx, N_CTX, BLOCK, RUNNING, HOLDERS)
        batch = TokenBatch(N_CTX)
        prompt = model.tokenize("In the beginning the universe was created. " * 6)[:50]
        first = Seq(list(prompt))
        assert kv.try_admit(first)
        batch.add_run(np.asarray(first.tokens, dtype=np.int32), 0, first.seq_id, True)
        assert ctx.decode(batch) is DecodeOutcome.OK
        kv.computed(first, len(first.tokens))
        kv.release(first)
        (holder,) = {e.holder for e in kv.ledger.cache_entries()}
        assert kv.ledger.stats.cached == 3  # 48 of its 50 tokens, in full blocks
        ctx.seq_rm(holder, 2 * BLOCK, 3 * BLOCK)  # what the window took
        second = Seq(list(prompt) + [236743])
        assert kv.try_admit(second)
        assert second.n_computed == 0 and second.cached_tokens == 0 and kv.lost_shares == 1
        assert kv.ledger.stats.cached == 0 and ctx.seq_pos_max(holder) == -1  # the idle cache is gone
        batch.clear()
        batch.add_run(np.asarray(second.tokens, dtype=np.int32), 0, second.seq_id, True)
        assert ctx.decode(batch) is DecodeOutcome.OK  # positions consistent: it decodes from 0
        kv.computed(second, len(second.tokens))
        kv.check()
        kv.release(second)
