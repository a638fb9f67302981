"""Draft tokens without a draft model: what followed the sequence's latest n-gram before, in its
own prompt and output, or in recent outputs of other requests of the same scope; for a structured
answer, also the rest of the word it is writing, from its prompt.

A draft is a guess of the next few tokens; the model verifies it in the next step (one row per
drafted token, engine/verify.py), so a wrong guess costs rows, never output. Three sources, tried
in this order:

- prompt lookup: the longest of the sequence's last `n` tokens (n from NGRAM_MAX down to
  NGRAM_MIN) seen earlier in its own tokens proposes the tokens that followed it there
  (repeated passages, code being edited, tool results echoed back, a model repeating itself);
- prompt words, for answers that must follow a JSON schema only: the word being written,
  completed from a word of the prompt that begins the same way (engine/prompt_words.py). An
  extraction copies its values from the prompt in other tokens than the prompt's, which token
  n-grams cannot match; it goes before other requests' outputs, which would propose their values;
- recent outputs: the same lookup as the first over the outputs of requests that finished
  recently with the same draft scope (a batch job's answers share structure). Scopes keep one
  client's text from ever being proposed for another's request: a draft never reaches a client
  unless the model computes the same tokens itself, but how fast it does could tell one client
  what another wrote.

A draft carries the length of its match: how many of the sequence's last tokens equal those
before the continuation it copies (up to DRAFT_MATCH_CAP). A long match is a passage being
copied and its continuation is nearly sure; a two-token match is often chance
(engine/speculation.py prices rows by it).

Each sequence's index is built incrementally as tokens are appended, so a lookup costs a few
dictionary reads per step.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Sequence as Seq

from engine.prompt_words import PromptWords, WordsOfPrompt
from engine.tuning import DRAFT_MATCH_CAP, DRAFT_NGRAM_MAX, DRAFT_OCCURRENCES, DRAFT_NGRAM_MIN, RECENT_OUTPUT_NGRAMS, RECENT_OUTPUTS_NGRAM_MIN

PROMPT_LOOKUP, RECENT_OUTPUTS, PROMPT_WORDS = "prompt_lookup", "recent_outputs", "prompt_words"
DRAFT_MODEL = "draft_model"  # a second model's drafts (engine/draft_model.py), when one is loaded
SOURCES = (PROMPT_LOOKUP, RECENT_OUTPUTS, PROMPT_WORDS, DRAFT_MODEL)


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    source: str
    match: int = 0  # tokens of context the source matched (0: not a copy, e.g. the draft model's)


def match_length(source: Seq[int], start: int, tokens: Seq[int], cap: int = DRAFT_MATCH_CAP) -> int:
    """How many tokens before `source[start]` equal the last ones of `tokens` (at most `cap`)."""
    n, end = 0, len(tokens)
    while n < cap and n < start and n < end and source[start - 1 - n] == tokens[end - 1 - n]:
        n += 1
    return n


class NgramIndex:
    """Where each n-gram (n in [n_min, n_max]) of a growing token list occurred lately (up to
    DRAFT_OCCURRENCES times), as the index of the token that followed it. Owned by its sequence's
    holder, like its tokens."""

    def __init__(self, n_min: int = DRAFT_NGRAM_MIN, n_max: int = DRAFT_NGRAM_MAX) -> None:
        self.n_min, self.n_max = n_min, n_max
        self._after: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # positions below this have their preceding n-grams indexed

    def update(self, tokens: Seq[int]) -> None:
        # Position i is indexed once it exists: the n-grams ending just before it point at it.
        for i in range(max(self._indexed, self.n_min), len(tokens)):
            for n in range(self.n_min, min(self.n_max, i) + 1):
                seen = self._after.setdefault(tuple(tokens[i - n:i]), [])
                seen.append(i)
                if len(seen) > DRAFT_OCCURRENCES:
                    del seen[0]
        self._indexed = max(self._indexed, len(tokens))

    def continuation(self, tokens: Seq[int], limit: int) -> tuple[tuple[int, ...], int]:
        """What followed the earlier occurrence of the list's longest final n-gram whose match
        runs back furthest (the latest among equals), and the length of that match. A passage
        being copied matches its original far back; the same words elsewhere match a few tokens."""
        self.update(tokens)
        end = len(tokens)
        for n in range(min(self.n_max, end), self.n_min - 1, -1):
            seen = self._after.get(tuple(tokens[end - n:end]))
            if seen:
                match, start = max((match_length(tokens, i, tokens), i) for i in seen)
                return _copied(tokens, start, limit), match
        return (), 0


def _copied(tokens: Seq[int], start: int, limit: int) -> tuple[int, ...]:
    """`limit` tokens copied from `start` on, the copy running on into itself past the end: text
    caught in a loop (a small model repeating itself) is drafted whole, not one period at a time."""
    end = len(tokens)
    copy: list[int] = []
    for i in range(start, start + limit):
        copy.append(tokens[i] if i < end else copy[i - end])
    return tuple(copy)


class RecentOutputs:
    """N-grams of recently finished outputs, per draft scope, bounded by RECENT_OUTPUT_NGRAMS
    entries in all (the oldest go first). Engine thread only.

    An output is indexed when a lookup in its scope first needs it, not when it finishes: in a
    crowded batch no drafts are looked for, and indexing every finished output there would cost
    Python time for nothing."""

    def __init__(self, n_min: int = RECENT_OUTPUTS_NGRAM_MIN, n_max: int = DRAFT_NGRAM_MAX,
                 capacity: int = RECENT_OUTPUT_NGRAMS) -> None:
        self.n_min, self.n_max, self.capacity = n_min, n_max, capacity
        # (scope, n-gram) -> (the output it came from, where its continuation starts)
        self._after: collections.OrderedDict[tuple, tuple[tuple[int, ...], int]] = collections.OrderedDict()
        self._pending: collections.OrderedDict[str, list[tuple[int, ...]]] = collections.OrderedDict()
        self._pending_ngrams = 0

    def add(self, scope: str, output: Seq[int]) -> None:
        output = tuple(output)
        self._pending.setdefault(scope, []).append(output)
        self._pending_ngrams += self._ngrams_in(output)
        # Within the bound, indexed n-grams go first, oldest first (an output waiting to be
        # indexed is usually newer), then the oldest waiting outputs.
        while self._pending_ngrams + len(self._after) > self.capacity:
            if self._after:
                self._after.popitem(last=False)
            else:
                oldest_scope, outputs = next(iter(self._pending.items()))
                self._pending_ngrams -= self._ngrams_in(outputs.pop(0))
                if not outputs:
                    del self._pending[oldest_scope]

    def continuation(self, scope: str, tokens: Seq[int], limit: int) -> tuple[tuple[int, ...], int]:
        if scope in self._pending:
            self._index(scope)
        end = len(tokens)
        for n in range(min(self.n_max, end), self.n_min - 1, -1):
            found = self._after.get((scope, tuple(tokens[end - n:end])))
            if found is not None:
                output, start = found
                return output[start:start + limit], match_length(output, start, tokens)
        return (), 0

    def __len__(self) -> int:
        return len(self._after) + self._pending_ngrams

    def _index(self, scope: str) -> None:
        after = self._after
        for output in self._pending.pop(scope):
            self._pending_ngrams -= self._ngrams_in(output)
            for i in range(self.n_min, len(output)):
                for n in range(self.n_min, min(self.n_max, i) + 1):
                    key = (scope, output[i - n:i])
                    after[key] = (output, i)
                    after.move_to_end(key)  # the newest occurrence wins, and is evicted last
        while len(after) > self.capacity:
            after.popitem(last=False)

    def _ngrams_in(self, output: tuple[int, ...]) -> int:
        """What _index adds for it: positions i >= n_min, each with n-grams n_min..min(n_max, i)."""
        growing = max(0, min(self.n_max, len(output) - 1) - self.n_min + 1)
        full = max(0, len(output) - 1 - self.n_max)
        return growing * (growing + 1) // 2 + full * (self.n_max - self.n_min + 1)


class Drafter:
    """Proposes drafts for a sequence from its own tokens; then, for a structured answer (given
    `words` and its prompt), by completing the word being written, which is this request's own
    value where other requests' outputs would propose theirs; then from recent outputs of its
    scope."""

    def __init__(self, recent: RecentOutputs | None = None, words: PromptWords | None = None) -> None:
        self.recent = recent or RecentOutputs()
        self.words = words

    def propose(self, index: NgramIndex, tokens: Seq[int], scope: str, limit: int,
                prompt: WordsOfPrompt | None = None) -> Draft | None:
        own, match = index.continuation(tokens, limit)
        if own:
            return Draft(own, PROMPT_LOOKUP, match)
        if prompt is not None and self.words is not None:
            word, match = self.words.completion(prompt, tokens, limit)
            if word:
                return Draft(word, PROMPT_WORDS, match)
        other, match = self.recent.continuation(scope, tokens, limit)
        return Draft(other, RECENT_OUTPUTS, match) if other else None

    def finished(self, scope: str, output: Seq[int]) -> None:
        if output:
            self.recent.add(scope, output)
