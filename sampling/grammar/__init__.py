"""JSON Schema -> byte-level pushdown automaton -> per-token masks, for constrained decoding.

Public API
----------
``compile_grammar(schema, vocab) -> CompiledGrammar`` (cached per (canonical schema JSON,
id(vocab)), within a memory bound: cache.py); ``CompiledGrammar.matcher() -> GrammarMatcher``
per request; the matcher gives ``allowed_mask(remaining_tokens=None)``,
``is_allowed(token, remaining_tokens=None)``, ``advance(token)``, ``is_complete``, ``is_finished``, ``min_tokens_to_complete()``.
``schema=None`` is OpenAI's ``json_object`` mode: any JSON *object* (not any value).

Design
------
1. schema.py turns the schema into a regular-expression IR over bytes (one IR per *rule*:
   rule 0 is the document; every ``$ref`` target that can reach itself is its own rule and
   its uses are ``Call`` nodes; non-recursive refs are inlined). "Any JSON value" is a rule.
2. nfa.py / dfa.py build a Thompson NFA and determinise each rule (alphabet compression,
   trimming of states that cannot finish, Hopcroft minimisation; the loops over states are C,
   csrc/automaton.c through native.py). All rules share one state
   numbering and one [states x 256] transition table; call edges sit beside it.
3. A matcher state is a set of stacks of automaton states (the top state is in the rule being
   matched, lower entries are return states). Non-recursive schemas always have exactly one
   stack of height one, i.e. a plain DFA state; ambiguity between recursive branches keeps
   several stacks alive until the bytes disambiguate (like a GLR parser).
   A string whose length bound exceeds 32 keeps a counter beside its automaton state
   (counting.py): the stack entry is then `state + n_states * count`.
4. distance.py computes, per state, U = tokens needed to finish the rule (exact shortest path
   over a budget token set that includes every single-byte token) — see its docstring for why
   a mask "U(after token) <= remaining - 1" can never get stuck and always completes in time.
5. frames.py walks a numpy byte-trie of the vocabulary (vocab_index.py, built once per vocab)
   from a state, giving U-after-token for all tokens with one gather per trie level, pruning
   dead subtrees. Cached per state (LRU): a mask is then one vector comparison. Tokens whose
   bytes cross a call or return boundary inside the token are few; they are simulated exactly
   on the stack set. ``is_allowed`` looks the token up in a cached table, or runs its bytes
   through the automaton (memoised per (state, byte)).

Output format and restrictions (all make the language *smaller*, so output stays valid)
---------------------------------------------------------------------------------------
* Compact JSON: no whitespace at all outside strings.
* Object members appear in the schema's ``properties`` order; required ones must appear,
  optional ones may be skipped; extra members come after the declared ones (with
  ``open_objects``: any order, README.md "Member order").
* Which keywords are enforced, ignored (unknown ones, annotations) or refused by name, and what
  an absent ``additionalProperties`` means (``open_objects``): see README.md in this folder.
* Duplicate keys among *extra* members are not prevented; nor, with ``open_objects``, among the
  optional members of objects too large to track (README.md, "Member order").
"""
from __future__ import annotations

import json
from typing import Callable

from ..vocabulary import TokenVocabulary
from .cache import GrammarCache
from .compiled import CompiledGrammar
from .errors import SchemaError, UnsupportedSchemaError
from .framed import CallFrame, TextFrame
from .matcher import GrammarMatcher
from .vocab_index import index_for

__all__ = ["CallFrame", "CompiledGrammar", "GrammarMatcher", "SchemaError", "TextFrame", "UnsupportedSchemaError",
           "compile_grammar", "compile_framed", "CACHE"]

# Compiled grammars kept for reuse, by (canonical schema JSON, vocabulary, open_objects): within
# an estimate of the memory they hold (their tables and the token tables they cached since), and
# a count for the many small ones.
CACHE = GrammarCache(max_bytes=256 * 2**20, max_entries=64)


def compile_grammar(schema: dict | bool | None, vocab: TokenVocabulary, *,
                    open_objects: bool = False) -> CompiledGrammar:
    """Compile `schema` (None = any JSON object) for `vocab`; cached, so repeats are near-free.

    `open_objects` says what an absent `additionalProperties` means: False (default) = no
    members besides those the schema names (properties, required, patternProperties), as in
    OpenAI's strict mode; True = JSON Schema's meaning, extra members of any value allowed."""
    try:
        # Key order is kept: it is the order of generated members.
        key = (json.dumps(schema, separators=(",", ":"), allow_nan=False), id(vocab), open_objects)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"schema is not JSON-serialisable: {e}") from None
    return _cached(key, vocab, lambda: CompiledGrammar(schema, index_for(vocab), open_objects=open_objects))


def compile_framed(frame: TextFrame, vocab: TokenVocabulary) -> CompiledGrammar:
    """Tool calls in a model's own syntax (framed.py), compiled for `vocab`; cached likewise."""
    return _cached(("frame", frame.key(), id(vocab)), vocab, lambda: CompiledGrammar(None, index_for(vocab), frame=frame))


def _cached(key: tuple, vocab: TokenVocabulary, compile_: Callable[[], CompiledGrammar]) -> CompiledGrammar:
    # The key holds id(vocab), which a freed vocabulary's successor may reuse: the hit must be
    # for the very same token table.
    hit = CACHE.get(key)
    if hit is not None and hit.idx.token_bytes is vocab.token_bytes:
        return hit
    grammar = compile_()
    CACHE.put(key, grammar)
    return grammar
