"""What a sampled token does to its sequence: text out, and whether the sequence is done."""
from __future__ import annotations

from engine.request import FinishReason
from engine.sequence import Sequence


def append_token(seq: Sequence, token: int, eog_tokens: frozenset[int], n_ctx: int) -> FinishReason | None:
    """Add one sampled token, stream its text, and return why the sequence ends (None: it goes on)."""
    seq.tokens.append(token)
    if seq.matcher is not None:
        seq.matcher.advance(token)
    if token in eog_tokens and (seq.matcher is not None or not seq.request.ignore_eos):
        return FinishReason.STOP
    seq.handle.publish_delta(seq.stop_filter.feed(seq.detokenizer.push(token)))
    if seq.stop_filter.stopped or (seq.matcher is not None and seq.matcher.is_finished):
        return FinishReason.STOP
    if seq.n_generated >= seq.request.max_tokens:
        return FinishReason.LENGTH
    if len(seq.tokens) > n_ctx:  # the next token would need a position past the context
        return FinishReason.CONTEXT_LENGTH
    return None


def flush_text(seq: Sequence) -> None:
    """Stream whatever text was held back (an incomplete UTF-8 character, a possible stop string)."""
    if not seq.stop_filter.stopped:
        seq.handle.publish_delta(seq.stop_filter.feed(seq.detokenizer.flush()))
        seq.handle.publish_delta(seq.stop_filter.flush())
