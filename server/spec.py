"""What one validated HTTP request asks the engine for, whichever API it came through.

The seam every dialect (the native /generate, OpenAI's completions and chat) goes through: its
parser reads the body into GenerationSpecs, one per choice, holding the prompt as text, token ids
or a ChatPrompt (messages, not yet rendered); `engine_requests` then renders each chat once with
the model's chat format and makes the engine's Requests. Shaping the answer is the dialect's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine import Request, SamplingParams
from engine.request import JsonAlternative
from server.chat_format import ChatFormatter, ChatMessage, RenderedChat
from server.structured import StructuredOutput
from server.tools import ToolSet

# Limits the HTTP layer adds to the engine's own (engine.request, sampling.params).
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TEMPERATURE = 2.0  # OpenAI's documented range; higher is noise on a small model
MAX_SEED = 2**63 - 1
MAX_LOGIT_BIAS_ENTRIES = 1024  # bounds the work one request can put on every sampling step
MAX_TIMEOUT_S = 86400.0  # a request deadline; beyond a day it is a mistake, not a deadline


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation, rendered into prompt tokens by the model's chat format (with the spec's
    tools declared) only at submit: rendering tokenizes, which must not stall the event loop."""

    messages: tuple[ChatMessage, ...]


@dataclass(frozen=True)
class GenerationSpec:
    """The body's fields, validated, with what only the HTTP layer needs (streaming, how to
    show logprobs, which field asked for JSON). `request()` makes the engine's Request."""

    prompt: str | Sequence[int] | ChatPrompt  # text, token ids, or chat messages to render
    stream: bool
    # The fields every API shares (schemas.read_sampling), its defaults already applied.
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    logit_bias: tuple[tuple[int, float], ...]
    seed: int | None
    stop: tuple[str, ...]
    priority: str
    timeout: float | None  # seconds from submission, after which it ends with "timeout"
    ignore_eos: bool  # generate past end-of-generation tokens (benchmarks; not with JSON)
    open_objects: bool  # an absent additionalProperties allows any members (JSON Schema's reading)
    speculative: bool  # false: no drafted tokens for it (docs/speculative-decoding.md)
    # What each API adds.
    logprobs: int = 0  # top alternatives per token the engine records; 0: no logprobs at all
    want_logprobs: bool = False  # per-token logprobs are wanted (even with 0 alternatives)
    structured: StructuredOutput | None = None
    echo: bool = False  # completions: the prompt in front of the text (and its logprobs, when asked)
    tools: ToolSet | None = None  # chat with tools: structured then holds the calls schema (if callable)
    # tool_choice "auto" with an output format: an answer that calls nothing is its document.
    answer_format: StructuredOutput | None = None
    return_token_ids: bool = False  # OpenAI routes: each choice carries its generated token ids

    @property
    def calls_tools(self) -> bool:
        """Functions may be called: the output is read as calls (or, with "auto", text)."""
        return self.tools is not None and bool(self.tools.callable)

    @property
    def may_answer_in_text(self) -> bool:
        """Under "auto": an answer may call nothing (free text, or the answer_format's document)."""
        return self.calls_tools and self.tools is not None and self.tools.choice == "auto"

    @property
    def prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token the engine scores, None for no scoring: echo with
        logprobs asks for it, and so does max_tokens 0 (the engine's scoring-only request)."""
        if self.echo and (self.want_logprobs or self.max_tokens == 0):
            return self.logprobs
        return None

    def request(self, request_id: str, rendered: RenderedChat | None = None, draft_scope: str = "",
                tenant: str = "", weight: float = 1.0) -> Request:
        """The engine's Request for this spec; `rendered` is its ChatPrompt rendered (and only
        then given); `draft_scope`, whose earlier outputs may propose drafts for it; `tenant` and
        `weight`, whose share of the tier it takes (engine/fair_share.py). Raises
        InvalidParameterError where the engine's own checks are stricter than the HTTP layer's
        (the caller turns it into a 400)."""
        if isinstance(self.prompt, ChatPrompt) != (rendered is not None):
            raise TypeError("a chat prompt is rendered first, and only a chat prompt is")
        prompt = self.prompt if rendered is None else rendered.token_ids
        # The transcript format's "\nuser:" stop would be refused next to JSON output, and is
        # not needed there: the grammar ends the answer when the document is complete.
        extra_stops = rendered.extra_stops if rendered is not None and self.structured is None else ()
        sampling = SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed, min_p=self.min_p,
            repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, logit_bias=self.logit_bias,
        )
        frame = None if self.tools is None else self.tools.tool_frame()
        return Request(
            prompt=prompt,
            max_tokens=self.max_tokens,
            sampling=sampling,
            stop=tuple(dict.fromkeys(self.stop + extra_stops)),
            priority=self.priority,
            ignore_eos=self.ignore_eos,
            format="raw" if self.structured is None else "json",
            json_schema=None if self.structured is None or frame is not None else self.structured.schema,
            tool_frame=frame,
            open_objects=self.open_objects,
            json_or_text=self.may_answer_in_text and self.answer_format is None,
            json_alternative=None if self.answer_format is None or self.tools is None
            else JsonAlternative(self.answer_format.schema, self.tools.calls_opening),
            # The engine records logprobs only when asked for at least one alternative.
            logprobs=max(1, self.logprobs) if self.want_logprobs else 0,
            prompt_logprobs=self.prompt_logprobs,
            timeout=self.timeout,
            request_id=request_id,
            speculative=self.speculative,
            draft_scope=draft_scope,
            tenant=tenant,
            weight=weight,
        )


def engine_requests(specs: Sequence[GenerationSpec], request_ids: Sequence[str],
                    chat: ChatFormatter | None, draft_scope: str = "", tenant: str = "",
                    weight: float = 1.0) -> list[Request]:
    """The engine's Request for each spec, with its id; `draft_scope` is the caller's (its
    owner id): only its own earlier outputs propose drafts for it. A chat is rendered once
    however many choices share it. Tokenizes: runs on the submit worker, not the event loop."""
    rendered: list[tuple[ChatPrompt, RenderedChat]] = []  # the choices of one chat share its prompt

    def render(spec: GenerationSpec) -> RenderedChat | None:
        if not isinstance(spec.prompt, ChatPrompt):
            return None
        for prompt, done in rendered:
            if prompt is spec.prompt:
                return done
        assert chat is not None, "chat prompts arrive only once a model (and its chat format) is loaded"
        rendered.append((spec.prompt, chat.render(list(spec.prompt.messages), spec.tools)))
        return rendered[-1][1]

    return [spec.request(request_id, render(spec), draft_scope, tenant, weight)
            for spec, request_id in zip(specs, request_ids, strict=True)]


def prompt_token_count(spec: GenerationSpec, chat: ChatFormatter) -> int:
    """How many tokens a chat spec's prompt renders to, rendered as engine_requests renders it
    (the same messages, the same tools): the token-counting routes. Tokenizes: run it off the
    event loop."""
    assert isinstance(spec.prompt, ChatPrompt)
    return len(chat.render(list(spec.prompt.messages), spec.tools).token_ids)
