"""Greedy golden output: the engine at batch size 1 computes what a plain llama_decode loop does."""
import json
from pathlib import Path

import pytest

from bench.raw_loop import run_raw_loop

pytestmark = pytest.mark.model

GOLDEN = json.loads((Path(__file__).parent / "golden" / "greedy_b1.json").read_text())


def test_engine_first_32_greedy_tokens_equal_the_stored_raw_loop_output(engine):
    assert engine.tokenize(GOLDEN["prompt"]) == GOLDEN["prompt_ids"]
    result = engine.generate(GOLDEN["prompt"], max_tokens=32, ignore_eos=True)[0]
    assert list(result.token_ids) == GOLDEN["tokens"]


def test_the_raw_loop_still_reproduces_the_stored_sequence(engine):
    run = run_raw_loop(engine.model, [GOLDEN["prompt_ids"]], 32)
    assert run.tokens[0] == GOLDEN["tokens"]
