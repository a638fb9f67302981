"""The compiled-grammar cache is bounded by the memory its grammars hold, not only by count."""
from __future__ import annotations

import pytest

import sampling.grammar as grammar_pkg
from sampling.grammar import compile_grammar
from sampling.grammar.cache import GrammarCache
from tests.test_grammar_support import VOCAB


class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def nbytes(self) -> int:
        return self.n


def test_evicts_least_recently_used_by_size():
    cache = GrammarCache(max_bytes=100, max_entries=64)
    a, b, c = _Sized(40), _Sized(40), _Sized(40)
    cache.put("a", a)
    cache.put("b", b)
    assert cache.get("a") is a          # "a" is now the most recently used
    cache.put("c", c)                   # 120 bytes: the least recently used ("b") goes
    assert cache.get("b") is None and cache.get("a") is a and cache.get("c") is c
    assert cache.nbytes() == 80


def test_sizes_are_read_when_entries_come_in_since_grammars_grow():
    cache = GrammarCache(max_bytes=100, max_entries=64)
    a = _Sized(10)
    cache.put("a", a)
    cache.put("b", _Sized(10))
    a.n = 95                            # "a" grew while in use
    cache.put("c", _Sized(10))
    assert cache.get("a") is None and len(cache) == 2


def test_the_newest_entry_stays_even_when_alone_over_the_bound():
    cache = GrammarCache(max_bytes=100, max_entries=64)
    cache.put("a", _Sized(30))
    cache.put("big", _Sized(500))
    assert len(cache) == 1 and cache.get("big") is not None


def test_count_bound_still_holds():
    cache = GrammarCache(max_bytes=10**9, max_entries=3)
    for k in range(5):
        cache.put(k, _Sized(1))
    assert [cache.get(k) is not None for k in range(5)] == [False, False, True, True, True]


def test_compile_grammar_evicts_by_size(monkeypatch):
    schemas = [{"type": "object", "properties": {f"field{i}_{j}": {"type": "string", "maxLength": 20}
                                                 for j in range(6)}, "required": [f"field{i}_0"]}
               for i in range(3)]
    first = compile_grammar(schemas[0], VOCAB)
    one = first.nbytes()
    assert one > 0
    monkeypatch.setattr(grammar_pkg, "CACHE", GrammarCache(max_bytes=int(one * 2.5), max_entries=64))
    grammars = [compile_grammar(s, VOCAB) for s in schemas]
    assert compile_grammar(schemas[2], VOCAB) is grammars[2]      # a hit
    assert len(grammar_pkg.CACHE) == 2                              # the oldest went for room
    assert compile_grammar(schemas[0], VOCAB) is not grammars[0]   # compiled again


def test_a_grammar_grows_as_it_is_used():
    g = compile_grammar({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}},
                        VOCAB)
    before = g.nbytes()
    m = g.matcher()
    for text in (b'{"name":"ab', b'c","n":1'):
        m.allowed_mask()
        m.advance_bytes(text)
    m.allowed_mask()
    assert g.nbytes() > before


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
