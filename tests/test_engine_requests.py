"""One request's life on the real model: cancel, stop strings, unicode, limits, seeds, async."""
import asyncio
import time

import pytest

from engine import Engine, FinishReason, InvalidParameterError, PromptTooLongError

pytestmark = pytest.mark.model


def test_cancel_mid_generation_frees_the_seq_id_and_its_kv(model_path):
    with Engine(model_path, n_ctx=1024, max_running=2, step_token_budget=64) as eng:
        handle = eng.submit("Count slowly from one to one thousand:", max_tokens=500)
        deadline = time.monotonic() + 60
        while len(handle.streamed_text()) < 10:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        held = eng.inspect(lambda r: [r.context.seq_pos_max(s) for s in range(2)])
        assert max(held) > 0, "the running request should hold KV cells"
        handle.cancel()
        result = handle.result(timeout=30)
        assert result.finish_reason is FinishReason.CANCELLED
        assert 1 <= result.metrics.tokens_generated < 500
        assert eng.inspect(lambda r: [r.context.seq_pos_max(s) for s in range(2)]) == [-1, -1]
        assert eng.stats().running == 0 and eng.stats().kv_cells_used == 0
        # The freed ids serve new requests, two at a time, with the cache clean between them.
        again = eng.generate(["Hello", "World"], max_tokens=4)
        assert all(r.finish_reason in (FinishReason.LENGTH, FinishReason.STOP) for r in again)


def test_cancel_while_waiting(model_path):
    with Engine(model_path, n_ctx=1024, max_running=1, step_token_budget=64) as eng:
        busy = eng.submit("Tell me a long story:", max_tokens=200)
        queued = eng.submit("Never runs", max_tokens=10)
        queued.cancel()
        assert queued.result(timeout=30).finish_reason is FinishReason.CANCELLED
        assert queued.result().metrics.tokens_generated == 0
        busy.cancel()
        busy.result(timeout=30)
        assert eng.inspect(lambda r: r.context.seq_pos_max(0)) == -1


def test_stop_string_split_across_tokens_is_cut_exactly(engine):
    prompt = "The capital of France is Paris. The capital of Germany is"
    reference = engine.generate(prompt, max_tokens=24)[0]
    pieces = [engine.model.token_bytes[t].decode("utf-8", "replace") for t in reference.token_ids]
    # A stop string made of the end of one token and the start of the next.
    for i in range(1, len(pieces) - 1):
        if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2:
            break
    else:
        pytest.fail(f"no two adjacent multi-character tokens in {pieces!r}")
    stop = pieces[i][-2:] + pieces[i + 1][:2]
    cut_at = reference.text.index(stop)
    handle = engine.submit(prompt, max_tokens=24, stop=[stop])
    streamed = "".join(handle.stream())
    result = handle.result()
    assert result.finish_reason is FinishReason.STOP
    assert result.text == reference.text[:cut_at]
    assert streamed == result.text  # no part of the stop string ever reached the stream


def test_multibyte_characters_are_never_split(engine):
    byte_tokens = {b: t for t, b in enumerate(engine.model.token_bytes) if len(b) == 1 and b[0] >= 0x80}
    assert len(byte_tokens) == 128, "Gemma's vocabulary has a byte-fallback token for every high byte"
    text = "é€😀"
    ids = [byte_tokens[bytes([b])] for b in text.encode()]
    # Feed the byte tokens as a prompt echo: the detokenizer must emit whole characters only.
    from engine.text import IncrementalDetokenizer

    detok = IncrementalDetokenizer(engine.model.token_bytes)
    deltas = [detok.push(t) for t in ids]
    assert "".join(deltas) == text and all("\ufffd" not in d for d in deltas)
    handle = engine.submit("Write three emoji and the word café in Japanese: ", max_tokens=40)
    deltas = list(handle.stream())
    result = handle.result()
    assert "".join(deltas) == result.text
    assert all("\ufffd" not in d for d in deltas)
    assert result.text.encode("utf-8").decode("utf-8") == result.text


def test_prompt_longer_than_the_context_is_a_clear_error(model_path):
    with Engine(model_path, n_ctx=256, max_running=2, step_token_budget=64) as eng:
        with pytest.raises(PromptTooLongError, match="256"):
            eng.submit("word " * 400, max_tokens=4)
        assert eng.stats().waiting == {"interactive": 0, "batch": 0}
        assert eng.generate("Still serving?", max_tokens=3)[0].metrics.tokens_generated >= 1


def test_generation_stops_at_the_context_limit(model_path):
    with Engine(model_path, n_ctx=256, max_running=2, step_token_budget=64) as eng:
        prompt = [2] + [236743] * 200  # token ids, to control the prompt length exactly
        result = eng.submit(prompt, max_tokens=1000).result(60)
        assert result.finish_reason in (FinishReason.CONTEXT_LENGTH, FinishReason.STOP)
        if result.finish_reason is FinishReason.CONTEXT_LENGTH:
            assert result.metrics.prompt_tokens + result.metrics.tokens_generated == eng.n_ctx + 1


@pytest.mark.parametrize(
    "options,needle",
    [({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.5}, "temperature"),
     ({"stop": [""]}, "stop"), ({"priority": "urgent"}, "priority"), ({"bogus": 1}, "bogus"),
     ({"logit_bias": {999_999: 1.0}}, "logit_bias"), ({"open_objects": True}, "open_objects"), ({"json_schema": {"type": "object", "maxProperties": -1}},
                                                      "json_schema")],
)
def test_bad_options_are_rejected_and_change_nothing(engine, options, needle):
    with pytest.raises(InvalidParameterError, match=needle) as info:
        engine.submit("hi", **options)
    assert info.value.field == needle  # the field at fault, named for the caller
    assert engine.stats().running == 0 and sum(engine.stats().waiting.values()) == 0


def test_same_seed_gives_the_same_sampled_text(engine):
    options = dict(max_tokens=24, temperature=0.9, top_k=40, top_p=0.9)
    prompt = "Invent a name for a new fruit:"
    first = engine.generate(prompt, seed=1234, **options)[0]
    second = engine.generate(prompt, seed=1234, **options)[0]
    others = [engine.generate(prompt, seed=s, **options)[0].token_ids for s in (1, 2, 3)]
    assert first.token_ids == second.token_ids
    assert any(o != first.token_ids for o in others), "different seeds should give different text"


def test_async_stream_and_await(engine):
    async def main():
        handle = engine.submit("The sky is blue because", max_tokens=12)
        deltas = [d async for d in handle]
        result = await handle
        return deltas, result

    deltas, result = asyncio.run(main())
    assert "".join(deltas) == result.text and len(deltas) >= 2


def test_prefilled_tokens_are_counted_when_the_last_prompt_token_lands_alone(model_path):
    with Engine(model_path, n_ctx=512, max_running=2, step_token_budget=32, prefix_cache=False) as eng:
        prompt = eng.tokenize("The history of the printing press begins in China. " * 8)[:33]
        result = eng.submit(prompt, max_tokens=2).result(60)
        assert result.metrics.prompt_tokens == 33
        assert eng.stats().tokens_prefilled == 33  # 32 in the first step, 1 in the second
