"""Draft tokens from a second, smaller model with the same vocabulary (`--draft-model PATH`).

The draft model runs in its own context, beside the main one and between its steps, on the
engine thread. Each sequence it drafts for gets a seq id of its own there (a slot) holding a
prefix of the sequence's tokens. Asked for drafts, it first catches up: it removes what it holds
past the longest prefix it shares with the sequence's tokens (drafted tokens the model
rejected) and feeds the rest, every asking sequence in one batch; then it extends each draft
greedily, one `llama_decode` per drafted position for all of them together, until the limit or
until its own top token is less likely than DRAFT_MODEL_P_MIN (a doubtful guess costs a decode
here and a row in the main step). Drafted tokens it fed stay in its context: the main model
keeps most of them, and the next catch-up then has nothing to recompute.

Its drafts are verified like the model-free ones (engine/verify.py), so a draft model changes
how fast tokens come, never which. Its time is its own cost, outside the main step's: the step
profile shows it as the `draft_model` phase. A slot is freed when its sequence finishes; when
the context or the slots run out, the sequences that drafted longest ago give theirs up.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np

from bindings import Context, ContextSettings, DecodeOutcome, Model, TokenBatch
from engine.model_source import resolve_model
from engine.ownership import SingleWriter
from engine.tuning import DRAFT_MODEL_CATCH_UP_ROWS, DRAFT_MODEL_P_MIN

if TYPE_CHECKING:
    from engine.sequence import Sequence

log = logging.getLogger("cobatch.engine")


class DraftModelError(ValueError):
    """The draft model cannot draft for this model (another vocabulary)."""


def vocabulary_mismatch(model: Seq[bytes], draft: Seq[bytes]) -> str | None:
    """How two vocabularies (each token's bytes, by id) differ, or None when they are the same."""
    if len(model) != len(draft):
        return f"it has {len(draft):,} tokens, the model {len(model):,}"
    for token, (ours, theirs) in enumerate(zip(model, draft)):
        if ours != theirs:
            return f"token {token} is {theirs!r} there and {ours!r} in the model"
    return None


def check_vocabulary(model: Model, draft: Model) -> None:
    """Raise DraftModelError unless every token id means the same in both models: a drafted token
    id is fed to the model as it is."""
    problem = vocabulary_mismatch(model.token_bytes, draft.token_bytes)
    if problem is None and (model.eog_tokens != draft.eog_tokens or model.special_tokens != draft.special_tokens):
        problem = "their special or end-of-generation tokens differ"
    if problem is not None:
        raise DraftModelError(f"the draft model {draft.path} does not share the vocabulary of {model.path}: "
                              f"{problem}; a draft model must use the model's own tokenizer")


def load_draft_model(spec: str, model: Model, n_ctx: int, n_slots: int, n_threads: int,
                     flash_attn: bool) -> DraftModel:
    """Load the draft model `spec` names (a path or a Hugging Face spec) for `model`, refusing one
    with another vocabulary. Its context has as many cells as the model's, `n_ctx`: it holds
    the tokens of the sequences it drafts for, as the main one does."""
    draft = Model(resolve_model(spec))
    try:
        check_vocabulary(model, draft)
        return DraftModel(draft, n_ctx, n_slots, n_threads, flash_attn)
    except BaseException:
        draft.close()
        raise


class _Slot:
    __slots__ = ("seq_id", "held", "synced", "used")

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.held: list[int] = []  # the tokens at positions 0.. of seq_id in the draft context
        self.synced = 0  # held[:synced] equals the sequence's tokens (which only ever grow)
        self.used = 0  # the draft model's call count when it last drafted for this slot


class DraftModel(SingleWriter):
    """A draft model's context and slots. Engine thread only; `close` after the engine stops."""

    def __init__(self, model: Model, n_ctx: int, n_slots: int, n_threads: int, flash_attn: bool,
                 p_min: float = DRAFT_MODEL_P_MIN) -> None:
        self.model = model
        self.p_min = p_min
        n_batch = max(DRAFT_MODEL_CATCH_UP_ROWS, n_slots)
        # swa_full: drafted positions are removed again, and a sliding-window cache may already
        # have overwritten the cells the window needs after that (a draft model is small).
        self.context = Context(model, ContextSettings(
            n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_seq_max=n_slots, n_threads=n_threads,
            n_threads_batch=n_threads, swa_full=True, flash_attn=1 if flash_attn else 0))
        self.n_slots = n_slots
        self._batch = TokenBatch(n_batch)
        self._free = list(range(n_slots - 1, -1, -1))
        self._slots: dict[Sequence, _Slot] = {}
        self._calls = 0
        self.seconds = 0.0  # spent drafting, in all
        self.decodes = 0  # llama_decode calls, catch-up and drafting

    def propose(self, wanted: dict[Sequence, int]) -> dict[Sequence, tuple[int, ...]]:
        """Greedy drafts of at most `wanted[seq]` tokens following each sequence's tokens (none for
        a sequence it found no room for, or whose next token it doubts)."""
        start = time.perf_counter()
        self._calls += 1
        try:
            slots = self._slots_for(wanted)
            nexts = self._catch_up(slots)
            return self._extend(slots, nexts, wanted)
        finally:
            self.seconds += time.perf_counter() - start

    def release(self, seq: Sequence) -> None:
        """The sequence finished: its cells and slot are free."""
        slot = self._slots.pop(seq, None)
        if slot is not None:
            self._drop(slot)

    def cells_held(self) -> int:
        """Positions held across all seq ids, as llama.cpp reports them (tests check for leaks)."""
        return sum(self.context.seq_pos_max(i) + 1 for i in range(self.n_slots))

    @property
    def sequences(self) -> int:
        return len(self._slots)

    def close(self) -> None:
        self.context.close()
        self.model.close()

    # ---- parts of propose --------------------------------------------------------------------
    def _slots_for(self, wanted: dict[Sequence, int]) -> dict[Sequence, _Slot]:
        """The slots of the sequences it drafts for this time: those whose tokens and draft fit its
        cells, after giving up those of sequences not asking, longest idle first. Without this
        check, sequences that share a prefix in the main cache (one cell each there, one per
        sequence here) would overflow the context at every step and be recomputed for nothing."""
        slots = {}
        n_ctx = self.context.n_ctx
        used = sum(len(slot.held) for slot in self._slots.values())
        for seq, limit in wanted.items():
            slot = self._slots.get(seq)
            grow = len(seq.tokens) + limit - (0 if slot is None else len(slot.held))
            if len(seq.tokens) + limit > n_ctx:
                continue  # it never fits: nobody else need give up anything for it
            while used + grow > n_ctx and self._evict(keep=wanted):
                used = sum(len(s.held) for s in self._slots.values())
            if used + grow > n_ctx or (slot is None and not self._free and not self._evict(keep=wanted)):
                continue
            if slot is None:
                slot = self._slots[seq] = _Slot(self._free.pop())
            slot.used = self._calls
            slots[seq] = slot
            used += grow
        return slots

    def _catch_up(self, slots: dict[Sequence, _Slot]) -> dict[Sequence, tuple[int, float]]:
        """Bring each slot to its sequence's tokens; each sequence's next token and its probability."""
        runs = []
        for seq, slot in slots.items():
            tokens = seq.tokens
            # The last token is always fed again if held: its row gives the next token's logits.
            keep = min(_common_prefix(slot.held, tokens, slot.synced), len(tokens) - 1)
            if keep < len(slot.held):
                self.context.seq_rm(slot.seq_id, keep, -1)
                del slot.held[keep:]
            slot.synced = len(tokens)
            runs.append((seq, slot, tokens[keep:]))
        nexts: dict[Sequence, tuple[int, float]] = {}
        batch = self._batch
        batch.clear()
        finishing: list[Sequence] = []  # sequences whose last row, with logits, is in the batch
        for seq, slot, pending in runs:
            done = 0
            while done < len(pending):
                n = min(len(pending) - done, batch.free_rows)
                last = done + n == len(pending)
                batch.add_run(np.asarray(pending[done:done + n], dtype=np.int32), len(slot.held), slot.seq_id, last)
                slot.held.extend(pending[done:done + n])
                done += n
                if last:
                    finishing.append(seq)
                if batch.free_rows == 0 and not self._decode_into(nexts, finishing, slots):
                    return {}
        if batch.n_tokens and not self._decode_into(nexts, finishing, slots):
            return {}
        return nexts

    def _extend(self, slots: dict[Sequence, _Slot], nexts: dict[Sequence, tuple[int, float]],
                wanted: dict[Sequence, int]) -> dict[Sequence, tuple[int, ...]]:
        drafts: dict[Sequence, list[int]] = {}
        active: list[Sequence] = []
        for seq, (token, p) in nexts.items():
            if p >= self.p_min:
                drafts[seq] = [token]
                if wanted[seq] > 1:
                    active.append(seq)
        batch = self._batch
        while active:
            batch.clear()
            for seq in active:
                slot = slots[seq]
                batch.add(drafts[seq][-1], len(slot.held), (slot.seq_id,), True)
                slot.held.append(drafts[seq][-1])
            found: dict[Sequence, tuple[int, float]] = {}
            if not self._decode_into(found, active, slots):
                break  # what was drafted so far stands (its slots are given up)
            active = []
            for seq, (token, p) in found.items():
                if p < self.p_min:
                    continue
                drafts[seq].append(token)
                if len(drafts[seq]) < wanted[seq]:
                    active.append(seq)
        return {seq: tuple(d) for seq, d in drafts.items()}

    def _decode_into(self, found: dict[Sequence, tuple[int, float]], finishing: list[Sequence],
                     slots: dict[Sequence, _Slot]) -> bool:
        """Decode the batch; the next token and its probability for each of `finishing`, in row
        order, go into `found` (and `finishing` is emptied). False if the context had no room:
        then every slot of this call is given up, and the caller stops."""
        self.decodes += 1
        outcome = self.context.decode(self._batch)
        while outcome is DecodeOutcome.KV_FULL and self._evict(keep=slots):
            outcome = self.context.decode(self._batch)
        if outcome is not DecodeOutcome.OK:
            log.info("draft model: no room in its context for %d sequences, drafting none", len(slots))
            for seq, slot in slots.items():
                if self._slots.pop(seq, None) is not None:
                    self._drop(slot)
            return False
        logits = self.context.logits(len(finishing))
        best = logits.argmax(axis=1)
        if self.p_min > 0.0:
            # The softmax's top probability: 1 / sum(exp(logit - top)).
            top = logits[np.arange(len(finishing)), best]
            p = 1.0 / np.exp(logits - top[:, None]).sum(axis=1)
        else:
            p = np.ones(len(finishing))
        for seq, token, prob in zip(finishing, best.tolist(), p.tolist()):
            found[seq] = (token, prob)
        finishing.clear()
        self._batch.clear()
        return True

    def _evict(self, keep: dict[Sequence, object]) -> bool:
        """Free the slot that drafted longest ago among sequences not in `keep`; False if none."""
        others = [(slot.used, seq) for seq, slot in self._slots.items() if seq not in keep]
        if not others:
            return False
        _, seq = min(others, key=lambda pair: pair[0])
        self._drop(self._slots.pop(seq))
        return True

    def _drop(self, slot: _Slot) -> None:
        self.context.seq_rm(slot.seq_id)
        slot.held.clear()
        slot.synced = 0
        self._free.append(slot.seq_id)


def _common_prefix(a: Seq[int], b: Seq[int], start: int) -> int:
    """The length of a's and b's common prefix, known to be at least `start`."""
    n = min(len(a), len(b))
    for i in range(start, n):
        if a[i] != b[i]:
            return i
    return n
