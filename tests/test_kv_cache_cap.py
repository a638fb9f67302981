"""The cap on idle cached blocks: past it, the least recently cached prefixes leave llama.cpp's
memory too (checked on a fake memory that records cells per seq id)."""
from __future__ import annotations

import numpy as np

from engine.handle import RequestHandle
from engine.kv_cache import KvCache
from engine.prefix_reuse import PrefixReuse
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
        cache.release(computed_sequence(cache, memory, tokens))
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
        cache.release(computed_sequence(cache, memory, tokens))
    assert cache.stats().blocks_cached == 6 and memory.n_cells_held() == 6 * 16


def _cache_with_rule(memory: FakeMemory, reuse: PrefixReuse) -> KvCache:
    return KvCache(memory, n_cells=512, block_size=16, running_ids=range(4), holder_ids=range(4, 12), reuse=reuse)


def test_a_long_miss_drops_idle_prefixes_when_the_cache_is_rarely_hit():
    memory = FakeMemory()
    # Scaled down: a prompt token is worth 100 idle cells' reads, history halves every 64 tokens.
    cache = _cache_with_rule(memory, PrefixReuse(prompt_token_in_idle_cells=100, half_life_tokens=64))
    first = [2 + k % 50 for k in range(48)]
    cache.release(computed_sequence(cache, memory, first))
    assert cache.stats().blocks_cached == 3 and cache.stats().idle_drops == 0
    # Two misses in a row: the measured share falls, and a 200-token miss is not worth the idle cells.
    other = Sequence(Request(prompt=[0]), [60 + k % 30 for k in range(200)],
                     RequestHandle("o", 200, lambda _: None), FakeModel.token_bytes, np.random.default_rng(0))
    assert cache.try_admit(other)
    stats = cache.stats()
    assert stats.reuse_share < 0.5 and stats.idle_drops == 1 and stats.blocks_cached == 0
    assert memory.n_cells_held() == 0  # dropped before the prefill: their cells left llama.cpp's memory
    cache.release(other)
    assert computed_sequence(cache, memory, first).cached_tokens == 0


def test_idle_prefixes_stay_while_the_cache_serves_most_prompt_tokens():
    memory = FakeMemory()
    cache = _cache_with_rule(memory, PrefixReuse(prompt_token_in_idle_cells=100, half_life_tokens=64))
    shared = [2 + k % 50 for k in range(160)]
    cache.release(computed_sequence(cache, memory, shared))
    for turn in range(3):  # the same long prefix asked again: the share climbs
        seq = computed_sequence(cache, memory, shared + [70 + turn])
        assert seq.cached_tokens == 160
        cache.release(seq)
    assert cache.stats().reuse_share > 0.6
    # A 48-token miss beside them now keeps them: 48 <= share x 100.
    miss = computed_sequence(cache, memory, [90 + k % 7 for k in range(48)])
    assert cache.stats().idle_drops == 0 and cache.stats().blocks_cached == 10
    cache.release(miss)


def test_the_reuse_share_starts_from_a_prior_and_follows_recent_prompts():
    reuse = PrefixReuse(prompt_token_in_idle_cells=1000, half_life_tokens=100)
    assert reuse.share == 0.5
    reuse.observe(100, 0)
    assert reuse.share < 0.5
    for _ in range(20):
        reuse.observe(100, 100)
    assert reuse.share > 0.99 and reuse.keep_idle(900) and not reuse.keep_idle(1100)
    for _ in range(20):
        reuse.observe(100, 0)
    assert reuse.share < 0.01 and not reuse.keep_idle(50) and reuse.keep_idle(0)


def test_a_finished_prompt_leaves_no_idle_cells_while_a_long_miss_still_prefills():
    memory = FakeMemory()
    cache = _cache_with_rule(memory, PrefixReuse(prompt_token_in_idle_cells=100, half_life_tokens=64))
    done = computed_sequence(cache, memory, [2 + k % 50 for k in range(64)])
    pending = Sequence(Request(prompt=[0]), [60 + k % 30 for k in range(200)],
                       RequestHandle("p", 200, lambda _: None), FakeModel.token_bytes, np.random.default_rng(0))
    assert cache.try_admit(pending) and pending.n_computed == 0  # 200 tokens still to prefill
    drops = cache.stats().idle_drops
    cache.release(done)  # its 4 blocks would sit idle through those 200 tokens
    assert cache.stats().blocks_cached == 0 and cache.stats().idle_drops == drops + 1
    cache.computed(pending, 200)
    cache.release(pending)  # nothing left to prefill: its blocks stay
    assert cache.stats().blocks_cached == 12
