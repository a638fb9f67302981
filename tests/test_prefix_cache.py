"""Prefix sharing through llama_memory_seq_cp, on the real model."""
import numpy as np
import pytest

from engine import Engine, FinishReason
from tests.server_fixtures import wait_until

pytestmark = pytest.mark.model

SYSTEM = (
    "You are a careful assistant for a small bakery. Answer customers politely, mention opening "
    "hours (8am to 6pm, closed on Mondays) when relevant, suggest seasonal pastries, and never "
    "promise deliveries outside the city. "
) * 7


@pytest.fixture(scope="module")
def engines(model_path):
    with Engine(model_path, n_ctx=2048, max_running=8, step_token_budget=512) as cached, \
            Engine(model_path, n_ctx=2048, max_running=8, step_token_budget=512, prefix_cache=False) as plain:
        yield cached, plain


def test_shared_300_token_prefix_is_not_recomputed_and_gives_the_same_tokens_and_logits(engines):
    cached, plain = engines
    first_prompt = SYSTEM + "Customer: Are you open on Monday?\nAssistant:"
    prompt = SYSTEM + "Customer: Which pastries do you have in autumn?\nAssistant:"
    a, b = cached.tokenize(first_prompt), cached.tokenize(prompt)
    prefix_len = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)  # tokens in common
    assert prefix_len >= 300
    first = cached.generate(first_prompt, max_tokens=4)[0]
    assert first.metrics.cached_tokens == 0
    before = cached.stats().tokens_prefilled
    options = dict(max_tokens=8, logprobs=5, ignore_eos=True)
    hit = cached.generate(prompt, **options)[0]
    miss = plain.generate(prompt, **options)[0]
    n_prompt = hit.metrics.prompt_tokens
    assert hit.metrics.cached_tokens == (prefix_len // 16) * 16  # every full shared block reused
    assert cached.stats().tokens_prefilled - before == n_prompt - hit.metrics.cached_tokens
    assert miss.metrics.cached_tokens == 0
    assert hit.token_ids[:4] == miss.token_ids[:4]
    # Tolerance: in llama.cpp's unified cache, logits move with how many cells are in use. Measured
    # here on this prompt: an unrelated sequence holding ~330 cells shifts these top-5 logprobs by
    # up to 0.45 (chunking the prefill differently: 0.0); the cache hit shifts them by 0.27.
    # Attending to a wrong cell would change the chosen tokens and the candidate set.
    for a, b in zip(hit.logprobs[:4], miss.logprobs[:4]):
        assert a.top[0][0] == b.top[0][0]
        top_a, top_b = dict(a.top), dict(b.top)
        common = set(top_a) & set(top_b)
        assert len(common) >= 4
        assert np.allclose([top_a[t] for t in common], [top_b[t] for t in common], atol=0.5)


def test_concurrent_requests_share_a_prefix_that_is_still_being_served(engines):
    cached, _ = engines
    cached.generate(SYSTEM + "Customer: hello\nAssistant:", max_tokens=2)  # seeds the cache
    questions = [f"Customer: question number {i}?\nAssistant:" for i in range(6)]
    results = cached.generate([SYSTEM + q for q in questions], max_tokens=6)
    assert all(r.metrics.cached_tokens >= 288 for r in results)
    assert all(r.finish_reason in (FinishReason.LENGTH, FinishReason.STOP) for r in results)
    wait_until(lambda: cached.stats().kv.blocks_used == 0, 10, "blocks still used")  # the snapshot after the step
    assert cached.stats().kv.prefix_hits >= 6


def test_multi_turn_chat_reuses_the_previous_turn(engines):
    cached, _ = engines
    turn1 = "User: Name a fruit.\nAssistant:"
    reply = cached.generate(turn1, max_tokens=24, ignore_eos=True)[0]
    turn2 = turn1 + reply.text + "\nUser: And a vegetable?\nAssistant:"
    second = cached.generate(turn2, max_tokens=4)[0]
    # The first turn's prompt and reply were cached; all their full blocks are served again.
    assert second.metrics.cached_tokens >= ((reply.metrics.prompt_tokens + 20) // 16) * 16


def test_preempted_sequence_resumes_with_its_output_kept(model_path):
    # 16 blocks of 16 cells: three sequences of ~110 tokens cannot all grow, so one is preempted
    # (without drafts: sequences that draft at different paces need not all grow at once).
    with Engine(model_path, n_ctx=256, max_running=3, step_token_budget=64, block_size=16,
                speculative=False) as eng:
        assert eng.n_ctx == 256
        prompts = [f"Story {i}: once upon a time there was a" for i in range(3)]
        together = eng.generate(prompts, max_tokens=100, ignore_eos=True)
        assert eng.stats().preemptions >= 1
        for r in together:
            assert r.metrics.tokens_generated == 100 and r.finish_reason is FinishReason.LENGTH
            assert len(r.token_ids) == 100
        # Stats are a snapshot published after the step that answered: wait for it.
        wait_until(lambda: eng.stats().kv.blocks_used == 0, 10, "blocks still used")
        held = eng.inspect(lambda r: [r.context.seq_pos_max(s) for s in range(3)])
        assert held == [-1, -1, -1]


def _fresh_prefix(tag: str) -> str:
    # A system prompt no earlier test has cached.
    return f"[{tag}] " + SYSTEM


def test_requests_arriving_together_compute_their_shared_prompt_once(engines):
    cached, _ = engines
    system = _fresh_prefix("together")
    prompts = [system + f"Customer: question number {i} about bread?\nAssistant:" for i in range(8)]
    shared = len(cached.tokenize(system))
    suffixes = sum(len(cached.tokenize(p)) - shared for p in prompts)
    before = cached.stats().tokens_prefilled
    results = cached.generate(prompts, max_tokens=4, ignore_eos=True)
    prefilled = cached.stats().tokens_prefilled - before
    # One leader computes the system prompt; the others wait for its blocks, share them as soon
    # as they are published, and borrow its cells past the last full block (the rest of the
    # system prompt, and the start of the question they have in common).
    assert prefilled <= 1.1 * (shared + suffixes), (prefilled, shared, suffixes)
    assert all(r.metrics.cached_tokens >= shared for r in sorted(results, key=lambda r: r.metrics.cached_tokens)[1:])
    assert all(r.metrics.tokens_generated == 4 for r in results)
    wait_until(lambda: cached.stats().kv.blocks_used == 0, 10, "blocks still used")


def test_followers_of_a_cancelled_leader_compute_for_themselves(engines):
    cached, _ = engines
    system = _fresh_prefix("cancelled leader")
    handles = [cached.submit(system + f"Customer: order {i}?\nAssistant:", max_tokens=3, ignore_eos=True)
               for i in range(4)]
    handles[0].cancel()
    results = [h.result(timeout=300) for h in handles]
    assert results[0].finish_reason is FinishReason.CANCELLED
    assert all(r.finish_reason is FinishReason.LENGTH and r.metrics.tokens_generated == 3 for r in results[1:])
    wait_until(lambda: cached.stats().running == 0 and cached.stats().kv.blocks_used == 0, 10, "still running")


def test_interleaved_conversations_keep_their_history_with_few_holders(model_path):
    """Each turn's prompt and reply pile up under the holder of the turn before: with 4 holders,
    4 conversations taking turns in rotation still find their whole history cached (two holders
    per turn ran the holders out, and freeing one evicted live conversations' latest turns)."""
    with Engine(model_path, n_ctx=2048, max_running=4, step_token_budget=256, cache_holders=4,
                cache_max_fraction=1.0) as engine:
        histories = [f"Conversation {c} about {topic}.\n" for c, topic in enumerate(("tea", "maps", "owls", "jazz"))]
        previous = [0] * 4  # tokens of the last turn's prompt and reply
        for turn in range(5):
            for c in range(4):
                histories[c] += f"User: tell me more, part {turn}.\nAssistant:"
                result = engine.generate(histories[c], max_tokens=16, ignore_eos=True, temperature=0)[0]
                if turn:
                    assert result.metrics.cached_tokens >= ((previous[c] - 8) // 16) * 16, (turn, c)
                previous[c] = result.metrics.prompt_tokens + 16
                histories[c] += result.text + "\n"
