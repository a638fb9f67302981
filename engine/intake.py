"""Request → Sequence on the caller's thread: options, tokens, limits and the grammar.

Everything that can refuse a request happens here, before anything is queued, so a refusal
changes nothing in the engine. Nothing here touches the llama.cpp context.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence as Seq

import numpy as np

from engine.handle import LoopWaker, RequestHandle
from engine.request import Request
from engine.sequence import Sequence
from engine.errors import PromptTooLongError
from sampling.errors import InvalidParameterError
from sampling.grammar import SchemaError, compile_framed, compile_grammar
from sampling.grammar.either import EitherMatcher
from sampling.grammar.trigger import TriggeredMatcher
from sampling.params import SamplingParams
from sampling.vocabulary import TokenVocabulary

_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)
_REQUEST_FIELDS = frozenset(Request.__dataclass_fields__)


class Intake:
    def __init__(self, model: Any, n_ctx: int, canceller: Callable[[str], None],
                 waker: LoopWaker | None = None) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self._canceller = canceller
        self._waker = waker
        self.vocabulary = TokenVocabulary(model.token_bytes, model.eog_tokens, model.special_tokens)

    def sequence(self, request: Request | str | Seq[int], options: dict[str, Any]) -> Sequence:
        """Raises InvalidParameterError or PromptTooLongError for a request that cannot run."""
        request = as_request(request, options)
        prompt_ids = self._prompt_ids(request)
        bad_bias = [t for t, _ in request.sampling.logit_bias if t >= self.model.n_vocab]
        if bad_bias:
            raise InvalidParameterError(
                f"logit_bias token id {bad_bias[0]} is outside the vocabulary (size {self.model.n_vocab})",
                field="logit_bias",
            )
        matcher = self._grammar_matcher(request) if request.format == "json" else None
        handle = RequestHandle(request.request_id, len(prompt_ids), self._canceller, self._waker)
        rng = np.random.default_rng(request.sampling.seed)
        return Sequence(request, prompt_ids, handle, self.model.token_bytes, rng, matcher)

    def _prompt_ids(self, request: Request) -> list[int]:
        if isinstance(request.prompt, str):
            ids = self.model.tokenize(request.prompt, add_bos=request.add_bos)
        else:
            ids = list(request.prompt)
            bad = [t for t in ids if t >= self.model.n_vocab]
            if bad:
                raise InvalidParameterError(
                    f"token id {bad[0]} is outside the vocabulary (size {self.model.n_vocab})", field="prompt"
                )
        if not ids:
            raise InvalidParameterError("the prompt tokenizes to nothing", field="prompt")
        if len(ids) >= self.n_ctx:
            raise PromptTooLongError(
                f"prompt has {len(ids)} tokens but the context holds {self.n_ctx}; "
                f"shorten it to at most {self.n_ctx - 1} tokens"
            )
        return ids

    def _grammar_matcher(self, request: Request) -> Any:
        # The schema was checked when the Request was made (engine.request.JsonSchema): what the
        # compiler refuses here is what it cannot express, such as an unsupported keyword.
        frame = request.tool_frame
        matcher = self._compiled(request.json_schema, request.open_objects, "json_schema", frame)
        alternative = request.json_alternative
        if alternative is not None:
            matcher = EitherMatcher(matcher, self._compiled(alternative.schema, request.open_objects,
                                                            "json_alternative"), alternative.opening.encode(),
                                    None if frame is None else frame.opening_token)
        if request.json_or_text:  # free text is always possible, so no budget is too small
            if frame is None:
                return TriggeredMatcher(matcher)
            return TriggeredMatcher(matcher, frame.opening_token, after_text=frame.after_text,
                                    marker=frame.marker.encode())
        needed = matcher.min_tokens_to_complete()
        if request.max_tokens < needed:
            raise InvalidParameterError(
                f"max_tokens={request.max_tokens} is too small for this schema: its shortest "
                f"document needs {needed} tokens",
                field="max_tokens", needed_tokens=needed,
            )
        return matcher

    def _compiled(self, schema: Any, open_objects: bool, field: str, frame: Any = None) -> Any:
        """The matcher of `schema` (or of tool calls in `frame`, a model's own syntax)."""
        try:
            if frame is not None:
                grammar = compile_framed(frame, self.vocabulary)
            else:
                grammar = compile_grammar(None if schema is None else dict(schema), self.vocabulary,
                                          open_objects=open_objects)
        except SchemaError as exc:
            raise InvalidParameterError(f"{field}: {exc}", field=field) from exc
        return grammar.matcher()


def as_request(request: Request | str | Seq[int], options: dict[str, Any]) -> Request:
    if isinstance(request, Request):
        if options:
            raise InvalidParameterError("pass options inside the Request, not beside it")
        return request
    options = dict(options)
    unknown = set(options) - _SAMPLING_FIELDS - _REQUEST_FIELDS
    if unknown:
        raise InvalidParameterError(f"unknown option(s): {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
    sampling = SamplingParams(**{k: options.pop(k) for k in list(options) if k in _SAMPLING_FIELDS})
    return Request(prompt=request, sampling=sampling, **options)
