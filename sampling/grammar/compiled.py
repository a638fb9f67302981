"""CompiledGrammar: a schema compiled for one vocabulary (schema -> IR -> NFA -> automaton ->
token distances), with the matchers that follow it."""
from __future__ import annotations

import numpy as np

from . import dfa, distance
from .counting import Counting
from .errors import SchemaError
from .framed import FramedCompiler, TextFrame
from .frames import U16_INF
from .matcher import GrammarMatcher
from .pushdown import INF, Pushdown
from .schema import SchemaCompiler
from .thompson import Thompson
from .vocab_index import VocabIndex


class CompiledGrammar(Pushdown):
    def __init__(self, schema: object, idx: VocabIndex, *, open_objects: bool = False,
                 frame_cache: int = 256, mask_cache: int = 64, frame: TextFrame | None = None) -> None:
        """`frame`: tool calls in a model's own syntax (framed.py) instead of a JSON document."""
        single = np.zeros(256, dtype=bool)
        single[list(idx.single_byte)] = True
        self.json_document = frame is None  # the output parses as JSON (structured_data)
        try:
            comp, aut, counting, budget = build_automaton(schema, idx, open_objects, single, True, frame)
        except dfa.CountConflict:    # rare: alternatives with different length bounds at one place
            comp, aut, counting, budget = build_automaton(schema, idx, open_objects, single, False, frame)
        _check_left_recursion(aut)
        U = distance.token_distances(aut, budget, counting)
        if U[aut.rule_start[0]] >= INF:
            raise SchemaError("no document satisfying this schema can be written with this vocabulary")
        if (U[U < INF] >= int(U16_INF)).any():
            raise SchemaError("schema needs over 65534 tokens to complete: not supported")
        super().__init__(idx, aut, U, counting, comp.unique_rules, frame_cache, mask_cache)

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)


def build_automaton(schema: object, idx: VocabIndex, open_objects: bool, single: np.ndarray, count_strings: bool,
                    frame: TextFrame | None = None):
    """(the schema compiler, its automaton, string counters, the budget token set); `single`:
    the bytes the vocabulary has a token of their own for."""
    comp = SchemaCompiler(schema, open_objects=open_objects, count_strings=count_strings) if frame is None \
        else FramedCompiler(frame, count_strings=count_strings)
    rules = comp.compile()
    nfa = Thompson()
    frags = [nfa.build(r) for r in rules]
    prepared = dfa.prepare(nfa, frags)
    budget = distance.budget_tokens_soon(idx, comp.literals)    # beside subset construction (C)
    aut = dfa.build_prepared(prepared)
    return comp, aut, Counting(aut, single), budget()


def _check_left_recursion(aut: dfa.Automaton) -> None:
    # A rule whose start state calls (transitively, via start states) itself would make the
    # stack grow without consuming input.
    graph = {r: {q for q, _ in aut.calls[s]} for r, s in enumerate(aut.rule_start)}
    for r in graph:
        seen, todo = set(), list(graph[r])
        while todo:
            q = todo.pop()
            if q == r:
                raise SchemaError("left-recursive $ref: a schema refers to itself before any output")
            if q not in seen:
                seen.add(q)
                todo.extend(graph.get(q, ()))
