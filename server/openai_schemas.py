"""Validation of OpenAI-compatible request bodies (/v1/completions, /v1/chat/completions).

Accepted as OpenAI documents them: model, prompt | messages, max_tokens (chat also
max_completion_tokens), temperature, top_p, n, stream, stream_options.include_usage, stop, seed,
user, presence_penalty, frequency_penalty, logit_bias, logprobs (completions: an integer 0..20;
chat: true/false with top_logprobs 0..20), and for chat response_format (json_object,
json_schema: constrained by the engine's grammar), tools, tool_choice and parallel_tool_calls
(server/tools.py). Extensions: top_k, min_p, repetition_penalty,
priority ("interactive" | "batch") and ignore_eos (generate past end-of-generation tokens:
benchmarks). Defaults (OpenAI's where it has one): server/defaults.py COMPLETIONS and CHAT.

`prompt` may be a list (of strings or of token-id lists) and `n` asks for several choices of
each prompt (limits: server/schemas.py MAX_N, MAX_PROMPTS): each choice has its index, and all
are admitted or refused together. With a seed, choice i > 0 samples with a seed derived from
(seed, i). Parts of the API this engine cannot do are refused with 501 and say so: best_of > 1,
suffix, the legacy functions / function_call. Logprobs with streaming are refused with 400.

Completions take `echo` (the prompt in front of the text; with `logprobs`, the prompt's tokens
are scored too, the first one null, as OpenAI's legacy API and vLLM give them), and
`max_tokens` 0 with echo scores the prompt without generating (what lm-evaluation-harness sends
for log-likelihoods). Chat refuses `echo` (400).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from engine.request import MAX_LOGPROBS
from server import structured
from server.chat_format import ChatMessage, RenderedChat, parse_messages
from server.defaults import CHAT, COMPLETIONS
from server.errors import BadRequest, NotImplementedFeature
from server.structured import StructuredOutput
from server.tools import ToolSet, parse_tools
from server.schemas import MAX_PROMPTS, check_combinations, choice_specs, read_n, read_sampling
from server.spec import GenerationSpec
from server.validation import FieldReader




@dataclass(frozen=True)
class CompletionRequest:
    model: str
    specs: list[GenerationSpec]  # the choices: n per prompt, prompt by prompt
    include_usage: bool
    n: int = 1


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[ChatMessage]
    spec: GenerationSpec  # its prompt is filled in by with_prompt() once the chat is rendered
    include_usage: bool
    n: int = 1  # choices
    tools: ToolSet | None = None

    def with_prompt(self, rendered: RenderedChat) -> list[GenerationSpec]:
        """The choices' specs, the rendered chat as their prompt."""
        # The transcript format's "\nuser:" stop would be refused next to JSON output, and is
        # not needed there: the grammar ends the answer when the document is complete.
        extra_stops = () if self.spec.structured is not None else rendered.extra_stops
        return choice_specs(replace(self.spec, prompt=rendered.token_ids, extra_stops=extra_stops), self.n)


def parse_completion(body: dict[str, Any], *, n_ctx: int) -> CompletionRequest:
    fields = FieldReader(body)
    model = fields.string("model", non_empty=True)
    prompts = _completion_prompts(fields.raw("prompt", None))
    sampling = read_sampling(fields, n_ctx=n_ctx, defaults=COMPLETIONS, least_max_tokens=0)
    echo = fields.boolean("echo", False, nullable=True)
    if sampling["max_tokens"] == 0 and not echo:
        raise BadRequest("'max_tokens' 0 generates nothing: it only scores the prompt, with \"echo\": true",
                         param="max_tokens")
    stream, include_usage = _stream_fields(fields)
    _refuse_unsupported(fields)
    n = read_n(fields, sampling["max_tokens"], n_ctx)
    if n * len(prompts) > MAX_PROMPTS:
        raise BadRequest(f"{len(prompts)} prompts x n={n} is more than {MAX_PROMPTS} choices", param="n",
                         code="too_many_prompts")
    _refuse_unless(fields, "suffix", (None, ""), "'suffix' (insertion) is not supported by this engine")
    _refuse_unless(fields, "best_of", (None, 1), "'best_of' other than 1 is not supported by this engine")
    if body.get("logprobs") is False:  # some clients send false for "none"
        fields.raw("logprobs")
    logprobs = fields.integer("logprobs", None, minimum=0, maximum=MAX_LOGPROBS, nullable=True)
    fields.finish()
    check_combinations(sampling, stream=stream, wants_logprobs=logprobs is not None,
                       structured_output=None, logprobs_param="logprobs")
    specs = [choice for prompt in prompts
             for choice in choice_specs(GenerationSpec(prompt=prompt, stream=stream, logprobs=logprobs or 0,
                                                       want_logprobs=logprobs is not None, echo=echo,
                                                       **sampling), n)]
    return CompletionRequest(model, specs, include_usage, n)


def parse_chat(body: dict[str, Any], *, n_ctx: int) -> ChatRequest:
    fields = FieldReader(body)
    model = fields.string("model", non_empty=True)
    messages = parse_messages(fields.raw("messages", None))
    if fields.present("max_completion_tokens"):
        # The newer name wins when both are given, as in OpenAI's API.
        newer = fields.integer("max_completion_tokens", None, minimum=1, maximum=n_ctx, nullable=True)
        older = fields.integer("max_tokens", None, minimum=1, maximum=n_ctx, nullable=True)
        body_max = newer if newer is not None else older
    else:
        body_max = None
    if fields.present("echo"):  # OpenAI's chat API has no echo; say so rather than "unknown field"
        raise BadRequest("'echo' is a /v1/completions field; chat completions do not echo the prompt",
                         param="echo")
    sampling = read_sampling(fields, n_ctx=n_ctx, defaults=CHAT)
    if body_max is not None:
        sampling["max_tokens"] = body_max
    stream, include_usage = _stream_fields(fields)
    response_format = structured.from_response_format(fields.raw("response_format", None))
    _refuse_unsupported(fields)
    n = read_n(fields, sampling["max_tokens"], n_ctx)
    logprobs = fields.boolean("logprobs", False, nullable=True)
    top_logprobs = fields.integer("top_logprobs", None, minimum=0, maximum=MAX_LOGPROBS, nullable=True)
    if top_logprobs is not None and not logprobs:
        raise BadRequest("'top_logprobs' needs \"logprobs\": true", param="top_logprobs")
    _refuse_unless(fields, "functions", (None, []), "'functions' (the legacy form of tools) is not supported; "
                   "send 'tools'")
    _refuse_unless(fields, "function_call", (None, "none", "auto"), "'function_call' (the legacy form of "
                   "tool_choice) is not supported; send 'tool_choice'")
    tools = parse_tools(fields.raw("tools", None), fields.raw("tool_choice", None),
                        fields.raw("parallel_tool_calls", None))
    fields.finish()
    structured_output = response_format
    if tools is not None and tools.callable:
        _check_beside_calls(sampling, response_format)
        structured_output = StructuredOutput(tools.calls_schema(), source="tools")
    check_combinations(sampling, stream=stream, wants_logprobs=logprobs, structured_output=structured_output,
                       logprobs_param="logprobs")
    spec = GenerationSpec(prompt=(), stream=stream, structured=structured_output, logprobs=top_logprobs or 0,
                          want_logprobs=logprobs, tools=tools, **sampling)
    return ChatRequest(model, messages, spec, include_usage, n, tools)


def _check_beside_calls(sampling: dict[str, Any], response_format: StructuredOutput | None) -> None:
    """What cannot be honoured together with functions the output may call."""
    if response_format is not None:
        raise BadRequest("'response_format' cannot be combined with callable tools: an answer that calls a "
                         "function is a calls document, not that format (send \"tool_choice\": \"none\", or "
                         "declare the format as a tool)", param="response_format")
    if sampling["stop"]:
        raise BadRequest("'stop' cannot be combined with callable tools: a stop string could cut a call short",
                         param="stop")
    if sampling["open_objects"]:
        raise BadRequest("'open_objects' cannot be combined with callable tools: calls are written in the "
                         "declared member order", param="open_objects")


def _completion_prompts(value: Any) -> list[str | list[int]]:
    """A string or a list of token ids (one prompt), or a list of either (one choice each)."""
    if value is None:
        raise BadRequest("'prompt' is required", param="prompt")
    if isinstance(value, str) or (isinstance(value, list) and value and _is_token_ids(value)):
        return [_one_prompt(value)]
    if not isinstance(value, list) or not value:
        raise BadRequest("'prompt' must be a string, a list of token ids, or a non-empty list of either",
                         param="prompt")
    if len(value) > MAX_PROMPTS:
        raise BadRequest(f"'prompt' lists at most {MAX_PROMPTS} prompts (got {len(value)}); send more as a batch "
                         "job (/v1/batches)", param="prompt", code="too_many_prompts")
    return [_one_prompt(p) for p in value]


def _is_token_ids(value: list) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _one_prompt(value: Any) -> str | list[int]:
    if isinstance(value, str):
        if not value:
            raise BadRequest("'prompt' must not be empty", param="prompt")
        return value
    if isinstance(value, list) and value and _is_token_ids(value):
        if any(t < 0 for t in value):
            raise BadRequest("'prompt' token ids must be non-negative", param="prompt")
        return list(value)
    raise BadRequest("each prompt must be a non-empty string or a non-empty list of token ids", param="prompt")


def _stream_fields(fields: FieldReader) -> tuple[bool, bool]:
    stream = fields.boolean("stream", False, nullable=True)
    options = fields.object("stream_options", None, nullable=True)
    include_usage = False
    if options is not None:
        reader = FieldReader(options, where="stream_options.")
        include_usage = reader.boolean("include_usage", False, nullable=True)
        reader.finish()
        if not stream:
            raise BadRequest("'stream_options' is only allowed with \"stream\": true", param="stream_options")
    return stream, include_usage


def _refuse_unless(fields: FieldReader, name: str, harmless: tuple, message: str) -> None:
    """Accept a field only with a value that asks for nothing (its default); else 501."""
    if fields.present(name) and fields.raw(name) not in harmless:
        raise NotImplementedFeature(message, param=name)


def _refuse_unsupported(fields: FieldReader) -> None:
    """Fields both endpoints share that ask for something the engine does not do."""
    fields.string("user", None, nullable=True)  # an end-user id for abuse tracking; nothing to do here

