"""The first-token lane: an interactive request arriving while the engine is busy gets its first
token from a small context beside the main one, then decodes in the main one from imported cells."""
from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

from bindings import Context, ContextSettings, DecodeOutcome, Model, TokenBatch
from engine import Engine

pytestmark = pytest.mark.model

QUESTION = "Question: What is the capital of France?\nAnswer:"


@pytest.fixture(scope="module")
def lane_engine(model_path):
    with Engine(model_path, n_ctx=4096, max_running=16, n_threads=2, flash_attn=True,
                first_token_lane_tokens=32) as eng:
        yield eng


def _flood(engine: Engine, n: int = 6, tokens: int = 96):
    return engine.submit_many([f"Tell a long story about ship number {i}." for i in range(n)],
                              max_tokens=tokens, ignore_eos=True)


def _decoding(handles) -> None:
    """Until every handle has streamed text: the engine runs decode steps, not prompt-only ones
    (an arrival aborts those and is computed by the engine's own threads)."""
    while not all(h.streamed_text() for h in handles):
        time.sleep(0.001)


def _assert_nothing_held(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.running == 0 and stats.kv.blocks_used == 0
    assert engine.kv_cells_in_use() == stats.kv.blocks_cached * stats.kv.block_size


@contextlib.contextmanager
def _beside_a_flood(engine: Engine):
    """Batch work decoding while the body runs; after it, the flood finishes and nothing is held."""
    flood = _flood(engine)
    _decoding(flood)
    yield flood
    for h in flood:
        assert h.result(timeout=60).finish_reason.value in ("length", "cancelled")
    _assert_nothing_held(engine)


def test_imported_cells_continue_like_cells_computed_in_place(model_path):
    settings = dict(n_ctx=256, n_batch=64, n_ubatch=64, swa_full=True, flash_attn=1)
    with Model(model_path) as model, \
            Context(model, ContextSettings(n_seq_max=4, n_threads=2, n_threads_batch=2, **settings)) as main, \
            Context(model, ContextSettings(n_seq_max=1, n_threads=1, n_threads_batch=1, **settings)) as side:
        prompt = np.asarray(model.tokenize(QUESTION), dtype=np.int32)
        batch = TokenBatch(64)

        def decode(ctx: Context, seq_id: int, tokens: np.ndarray, start: int) -> np.ndarray:
            batch.clear()
            batch.add_run(tokens, start, seq_id, True)
            assert ctx.decode(batch) is DecodeOutcome.OK
            return np.array(ctx.logits(1)[0])

        decode(side, 0, prompt, 0)
        assert main.import_sequence(2, side.export_sequence(0))
        assert (main.seq_pos_min(2), main.seq_pos_max(2)) == (0, len(prompt) - 1)
        decode(main, 1, prompt, 0)  # the same prompt computed here, under another seq id
        nxt = np.asarray([236743], dtype=np.int32)
        imported, computed = decode(main, 2, nxt, len(prompt)), decode(main, 1, nxt, len(prompt))
        assert imported.argmax() == computed.argmax()
        assert np.abs(imported - computed).max() < 0.05 * np.abs(computed).max()


def test_a_short_interactive_request_on_a_busy_engine_gets_its_first_token_from_the_lane(lane_engine):
    alone = lane_engine.submit(QUESTION, max_tokens=8, priority="interactive").result()
    assert not alone.metrics.first_token_from_lane  # an idle engine's own threads are faster
    served = lane_engine.stats().lane_first_tokens
    with _beside_a_flood(lane_engine):
        busy = lane_engine.submit(QUESTION, max_tokens=8, priority="interactive").result()
    assert busy.metrics.first_token_from_lane and busy.finish_reason.value == "length"
    assert busy.metrics.ttft_steps == 0 and busy.metrics.cached_tokens == 0
    assert lane_engine.stats().lane_first_tokens == served + 1
    # Greedy: the continuation from imported cells is the one computed in place.
    assert busy.token_ids[:4] == alone.token_ids[:4] and len(busy.token_ids) == 8


def test_a_first_token_that_is_also_the_last_finishes_in_the_lane(lane_engine):
    with _beside_a_flood(lane_engine):
        result = lane_engine.submit(QUESTION, max_tokens=1, priority="interactive").result()
    assert result.metrics.first_token_from_lane and len(result.token_ids) == 1 and result.finish_reason.value == "length"


def test_the_lane_takes_one_request_at_a_time_and_only_what_it_can_serve(lane_engine):
    with _beside_a_flood(lane_engine):
        first = lane_engine.submit(QUESTION, max_tokens=6, priority="interactive", seed=1, temperature=0.8)
        second = lane_engine.submit(QUESTION, max_tokens=6, priority="interactive", seed=2, temperature=0.8)
        batch = lane_engine.submit(QUESTION, max_tokens=6, priority="batch")
        long_prompt = lane_engine.submit(QUESTION * 6, max_tokens=6, priority="interactive")
        logprobs = lane_engine.submit(QUESTION, max_tokens=6, priority="interactive", logprobs=2)
        results = [h.result() for h in (first, second, batch, long_prompt, logprobs)]
    assert [r.metrics.first_token_from_lane for r in results] == [True, False, False, False, False]
    assert all(len(r.token_ids) == 6 for r in results) and len(results[-1].logprobs) == 6


def test_a_cancel_while_in_the_lane_is_answered_once_the_lane_hands_it_over(lane_engine):
    with _beside_a_flood(lane_engine) as flood:
        handle = lane_engine.submit(QUESTION, max_tokens=200, priority="interactive", ignore_eos=True)
        handle.cancel()  # it is still in the lane (a prompt step there takes tens of ms)
        result = handle.result(timeout=30)
        for h in flood:
            h.cancel()
    assert result.finish_reason.value == "cancelled" and result.metrics.first_token_from_lane


def test_cobatch_serve_gives_an_openai_sdk_chat_beside_batch_work_its_first_token_from_the_lane():
    """`cobatch serve --first-token-lane-tokens 24`: a short chat streamed through the OpenAI SDK
    while /generate batch work decodes takes the lane; one over 24 prompt tokens (within the
    default bound of 32) does not."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import openai

    from tests.server_fixtures import metric, scrape, serve_process, wait_until

    with serve_process("--n-ctx", "2048", "--max-running", "8", "--first-token-lane-tokens", "24") as (_, url), \
            httpx.Client(base_url=url, timeout=60) as http, \
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        model = client.models.list().data[0].id

        def chat(content: str) -> tuple[str, int]:
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": content}], max_tokens=6, stream=True,
                stream_options={"include_usage": True}, extra_body={"priority": "interactive"})
            chunks = list(stream)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage.prompt_tokens

        def lane_total() -> float:
            return metric(scrape(http), "cobatch_first_token_lane_requests_total")

        body = {"max_tokens": 96, "ignore_eos": True, "priority": "batch"}
        with ThreadPoolExecutor(4) as pool:
            flood = [pool.submit(httpx.post, f"{url}/generate", json={"prompt": f"Story {i}:", **body}, timeout=300)
                     for i in range(4)]
            wait_until(lambda: metric(scrape(http), "cobatch_running_sequences") == 4, 60, "the flood never ran")
            time.sleep(0.5)  # their prompts take a step; then decode steps
            text, prompt_tokens = chat("In a few words and with no preamble at all, which city is the capital of France?")
            assert text and 24 < prompt_tokens <= 32
            assert lane_total() == 0  # over the bound given: the main context computed it
            text, prompt_tokens = chat("Capital of France?")  # the flood still decodes: it came after the other
            assert text and prompt_tokens <= 24
            assert lane_total() == 1
            assert all(f.result().status_code == 200 for f in flood)
        wait_until(lambda: metric(scrape(http), "cobatch_running_sequences") == 0, 30, "requests still running")


def test_a_chat_during_a_long_prefill_aborts_its_chunk_and_takes_the_lane(lane_engine):
    before = lane_engine.stats()
    long_prompt = lane_engine.submit(list(range(1000, 4000)), max_tokens=1)
    while lane_engine.stats().tokens_prefilled == before.tokens_prefilled:
        time.sleep(0.001)
    chat = lane_engine.submit(QUESTION, max_tokens=4, priority="interactive").result()
    assert chat.metrics.first_token_from_lane and len(chat.token_ids) == 4
    after = lane_engine.stats()
    # The chunk in flight was aborted and redone after (unless the chat came between two steps).
    assert after.steps_interrupted - before.steps_interrupted in (0, 1)
    assert long_prompt.result().finish_reason.value == "length"
    _assert_nothing_held(lane_engine)


def test_the_lane_hands_a_request_over_before_it_frees_itself_and_wakes_the_engine(model_path):
    # The engine holds prompt-only steps while the lane is busy: woken, it must find the lane
    # free and the sequence handed over, or it would sleep out its idle wait with work to do.
    from engine.first_token_lane import FirstTokenLane
    from engine.intake import Intake

    events = []
    with Model(model_path) as model:
        lane = FirstTokenLane(model, 32, 2048, swa_full=True, flash_attn=True,
                              hand_over=lambda seq, cells, reason, error=None: events.append(("hand_over", lane.is_busy(), cells is not None)),
                              wake_engine=lambda: events.append(("wake", lane.is_busy(), None)), published=lambda: None)
        try:
            seq = Intake(model, 2048, canceller=lambda request_id: None).sequence(
                QUESTION, dict(max_tokens=4, priority="interactive"))
            assert lane.accepts(seq) and lane.claim() and not lane.claim()
            lane.start(seq)
            deadline = time.monotonic() + 30
            while len(events) < 2:
                assert time.monotonic() < deadline
                time.sleep(0.001)
            assert events == [("hand_over", True, True), ("wake", False, None)]
            assert seq.n_generated == 1 and seq.first_token_from_lane and lane.claim()
            lane.unclaim()
        finally:
            lane.close()


def test_closing_the_lane_while_a_submit_holds_a_claim_returns_once_the_claim_is_dropped(model_path):
    # A submit that claimed the lane and then failed (a full queue) unclaims it after close() was
    # asked: close() must still return.
    import threading

    from engine.first_token_lane import FirstTokenLane

    with Model(model_path) as model:
        lane = FirstTokenLane(model, 32, 2048, swa_full=True, flash_attn=True, hand_over=lambda *args: None,
                              wake_engine=lambda: None, published=lambda: None)
        assert lane.claim()
        closer = threading.Thread(target=lane.close)
        closer.start()
        time.sleep(0.2)
        assert closer.is_alive()  # it waits for the claimed request, which may still be started
        lane.unclaim()
        closer.join(10)
        assert not closer.is_alive() and not lane.claim()
