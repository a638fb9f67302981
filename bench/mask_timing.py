"""Mask time per token: replay generated documents token by token through a fresh grammar
matcher and time the computation of each step's allowed-token mask, for cobatch's grammar and,
when the optional `llguidance` package is installed, for llguidance on the same vocabulary,
schema and tokens (its `fill_next_token_bitmask`, the per-token mask of a widely used engine).
"""
from __future__ import annotations

import json
import time
from typing import Any

from sampling.grammar import compile_grammar
from sampling.grammar.compiled import CompiledGrammar
from sampling.grammar.vocab_index import index_for
from sampling.vocabulary import TokenVocabulary


def cobatch_mask_times(schema: dict, vocab: TokenVocabulary, documents: list[list[int]],
                       budget: int, fresh: bool = False) -> list[float]:
    """Seconds per allowed_mask call, with the remaining-token budget the engine would pass.
    fresh: on a newly compiled grammar, whose per-state caches start empty (the first requests
    after a schema is first seen), instead of the shared, warm one."""
    grammar = CompiledGrammar(schema, index_for(vocab)) if fresh else compile_grammar(schema, vocab)
    times = []
    for tokens in documents:
        matcher = grammar.matcher()
        for i, token in enumerate(tokens):
            start = time.perf_counter()
            mask = matcher.allowed_mask(budget - i)
            times.append(time.perf_counter() - start)
            if not mask[token]:
                raise AssertionError(f"replayed token {token} refused at step {i}")
            if token in vocab.eog_tokens:
                break
            matcher.advance(token)
    return times


class _RawVocabulary:
    """What llguidance's TokenizerWrapper reads: token bytes by id, EOS and special ids."""

    def __init__(self, vocab: TokenVocabulary, eos: int) -> None:
        self.tokens = list(vocab.token_bytes)
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = sorted(vocab.special_tokens | vocab.eog_tokens)

    def __call__(self, text: bytes) -> list[int]:  # only used by llguidance's own tokenize
        return []


def llguidance_mask_times(schema: dict, vocab: TokenVocabulary, documents: list[list[int]]) -> dict[str, Any] | None:
    """{"times": seconds per mask, "refused": replays llguidance refused, "compile_s"} or None
    when llguidance is not installed."""
    try:
        import llguidance
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
    except ImportError:
        return None
    eos = min(vocab.eog_tokens)
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_RawVocabulary(vocab, eos)))
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    compile_s = time.perf_counter() - start
    bitmask = allocate_token_bitmask(1, tokenizer.vocab_size)
    times, refused = [], 0
    for tokens in documents:
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=1)
        if matcher.is_error():
            raise RuntimeError(f"llguidance: {matcher.get_error()}")
        for token in tokens:
            token = eos if token in vocab.eog_tokens else token
            start = time.perf_counter()
            fill_next_token_bitmask(matcher, bitmask, 0)
            times.append(time.perf_counter() - start)
            if not matcher.consume_token(token):
                refused += 1
                break
            if token == eos:
                break
    return {"times": times, "refused": refused, "compile_s": compile_s}
