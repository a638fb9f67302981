"""A step's outputs: one token sampled for each output row (with logprobs for the rows that ask),
then applied to its sequence: text out, and whether the sequence is done."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from engine.request import FinishReason
from engine.sequence import Sequence
from sampling.sampler import BatchSampler, NoAllowedTokenError, RowContext


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely tokens and their logprobs, best first


class SampledRows(NamedTuple):
    tokens: list[int]  # one per row; negative where the row's grammar had no allowed token
    dead_ends: dict[int, str]  # row -> why it could not be sampled


def sample_rows(sampler: BatchSampler, logits: np.ndarray, seqs: list[Sequence], n_ctx: int) -> SampledRows:
    wanting = [i for i, seq in enumerate(seqs) if seq.logprobs is not None]
    # Copies of the raw rows: the sampler adjusts logits in place.
    raw = {i: np.array(logits[i], dtype=np.float64) for i in wanting}
    dead_ends: dict[int, str] = {}
    try:
        tokens = sampler.sample_rows(logits, [_row_context(seq, n_ctx) for seq in seqs]).tolist()
    except NoAllowedTokenError as exc:  # only the rows whose grammar hit a dead end fail
        tokens = exc.tokens.tolist()
        dead_ends = {i: str(exc) for i in exc.rows}
    for i in wanting:
        if tokens[i] >= 0:
            seqs[i].logprobs.append(token_logprob(raw[i], tokens[i], seqs[i].request.logprobs))
    return SampledRows(tokens, dead_ends)


def token_logprob(raw_row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """The token's log-probability under the model's own distribution, and the n_top best."""
    peak = raw_row.max()
    log_z = peak + np.log(np.exp(raw_row - peak).sum())
    top = np.argpartition(-raw_row, n_top - 1)[:n_top]
    top = top[np.argsort(-raw_row[top], kind="stable")]
    return TokenLogprob(
        token=token,
        logprob=float(raw_row[token] - log_z),
        top=tuple((int(t), float(raw_row[t] - log_z)) for t in top),
    )


def _row_context(seq: Sequence, n_ctx: int) -> RowContext:
    params = seq.request.sampling
    return RowContext(
        params=params,
        rng=seq.rng,
        generated=seq.tokens[seq.n_prompt :] if params.has_penalties else (),
        matcher=seq.matcher,
        remaining_tokens=seq.token_budget(n_ctx),
    )


def append_token(seq: Sequence, token: int, eog_tokens: frozenset[int], n_ctx: int) -> FinishReason | None:
    """Add one sampled token, stream its text, and return why the sequence ends (None: it goes on)."""
    seq.tokens.append(token)
    if seq.matcher is not None:
        seq.matcher.advance(token)
        if getattr(seq.matcher, "released", False):  # the output turned out to be free text
            seq.matcher = None
    if token in eog_tokens and (seq.matcher is not None or not seq.request.ignore_eos):
        return FinishReason.STOP
    seq.handle.publish_delta(seq.stop_filter.feed(seq.detokenizer.push(token)))
    if seq.stop_filter.stopped or (seq.matcher is not None and seq.matcher.is_finished):
        return FinishReason.STOP
    if seq.n_generated >= seq.request.max_tokens:
        # A grammar's output complete at the budget's last token (tool calls in a model's own
        # syntax, where one more call could follow) is whole: only the end token had no room.
        # (Not an `auto` answer still undecided: it has written no text, let alone a document.)
        if seq.matcher is not None and seq.matcher.is_complete and getattr(seq.matcher, "in_document", True):
            return FinishReason.STOP
        return FinishReason.LENGTH
    if len(seq.tokens) > n_ctx:  # the next token would need a position past the context
        return FinishReason.CONTEXT_LENGTH
    return None


def flush_text(seq: Sequence) -> None:
    """Stream whatever text was held back (an incomplete UTF-8 character, a possible stop string)."""
    if not seq.stop_filter.stopped:
        seq.handle.publish_delta(seq.stop_filter.feed(seq.detokenizer.flush()))
        seq.handle.publish_delta(seq.stop_filter.flush())
