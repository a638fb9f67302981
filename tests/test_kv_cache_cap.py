"""The cap on idle cached blocks: past it, the least recently cached prefixes leave llama.cpp's
memory too (checked on a fake memory that records cells per seq id)."""
from __future__ import annotations

import numpy as np

from engine.handle import RequestHandle
from engine.kv_cache import KvCache
from engine.request import Request
from engine.sequence import Sequence
from tests.fake_backend import FakeMemory, FakeModel


def computed_sequence(cache: KvCache, memory: FakeMemory, tokens: list[int]) -> Sequence:
    seq = Sequence(Request(prompt=tokens), tokens, RequestHandle("r", len(tokens), lambda _: None),
                   FakeModel.token_bytes, np.random.default_rng(0))
    assert cache.try_admit(seq)
    memory.cells.setdefault(seq.seq_id, set()).update(range(seq.n_computed, len(tokens)))
    cache.computed(seq, len(tokens) - seq.n_computed)
    return seq


def test_cached_blocks_stay_under_the_cap_and_their_cells_are_freed():
    memory = FakeMemory()
    cache = KvCache(memory, n_cells=512, block_size=16, running_ids=range(4), holder_ids=range(4, 12),
                    max_cached_blocks=3)
    prompts = [[2 + (i * 13 + k) % 50 for k in range(40)] for i in range(3)]  # 2 full blocks each
    for tokens in prompts:
        cache.release(computed_sequence(cache, memory, tokens), keep_prefix=True)
        assert cache.stats().blocks_cached <= 3
    assert cache.stats().blocks_cached == 3
    assert memory.n_cells_held() == 3 * 16  # evicted blocks' cells are gone from memory too
    # The newest prefix is still served from the cache; the oldest one is not.
    newest = computed_sequence(cache, memory, prompts[2])
    assert newest.cached_tokens == 32
    oldest = computed_sequence(cache, memory, prompts[0])
    assert oldest.cached_tokens == 0


def test_no_cap_keeps_everything():
    memory = FakeMemory()
    cache = KvCache(memory, n_cells=512, block_size=16, running_ids=range(4), holder_ids=range(4, 12))
    for i in range(3):
        tokens = [2 + (i * 13 + k) % 50 for k in range(40)]
        cache.release(computed_sequence(cache, memory, tokens), keep_prefix=True)
    assert cache.stats().blocks_cached == 6 and memory.n_cells_held() == 6 * 16
