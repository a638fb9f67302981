"""Validation of OpenAI-compatible request bodies (/v1/completions, /v1/chat/completions).

Each body becomes an OpenAIRequest: its choices as dialect-neutral GenerationSpecs (server/spec.py;
a chat's messages stay unrendered until submit), and what only the answer's shape needs.

Accepted as OpenAI documents them: model, prompt | messages, max_tokens (chat also
max_completion_tokens), temperature, top_p, n, stream, stream_options.include_usage, stop, seed,
user, presence_penalty, frequency_penalty, logit_bias, logprobs (completions: an integer 0..20;
chat: true/false with top_logprobs 0..20), and for chat response_format (json_object,
json_schema: constrained by the engine's grammar), tools, tool_choice and parallel_tool_calls
(server/tools.py; beside callable tools, response_format is what an "auto" answer that calls
nothing follows), and safety_identifier, prompt_cache_key and metadata (read, unused:
CHAT_UNUSED), service_tier ("flex": the batch tier, "priority": the interactive tier, "auto" or
"default": the route's, server/tiers.py). Extensions: top_k, min_p, repetition_penalty, priority
("interactive" | "batch", wins over service_tier),
ignore_eos (generate past end-of-generation tokens: benchmarks), speculative (false: no
drafted tokens for it) and return_token_ids (vLLM's: each choice's generated token ids in
`token_ids`; not with streaming). Defaults (OpenAI's where it has one): server/defaults.py COMPLETIONS and
CHAT.

`prompt` may be a list (of strings or of token-id lists) and `n` asks for several choices of
each prompt (limits: server/schemas.py MAX_N, MAX_PROMPTS): each choice has its index, and all
are admitted or refused together. With a seed, choice i > 0 samples with a seed derived from
(seed, i). OpenAI's fields that ask for what this engine cannot do are refused with 501 naming
the field (COMPLETION_UNSUPPORTED, CHAT_UNSUPPORTED: best_of > 1, suffix, the legacy functions /
function_call, audio, modalities other than text, prediction, web_search_options, store,
reasoning_effort, verbosity, prompt_cache_retention other
than in_memory, prompt_cache_options, moderation); a value that asks for nothing (the field's
default) is accepted. Any other unknown field is a 400. Logprobs with streaming are a 400.

Completions take `echo` (the prompt in front of the text; with `logprobs`, the prompt's tokens
are scored too, the first one null, as OpenAI's legacy API and vLLM give them), and
`max_tokens` 0 with echo scores the prompt without generating (what lm-evaluation-harness sends
for log-likelihoods). Chat refuses `echo` (400).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.request import MAX_LOGPROBS
from server import structured
from server.chat_format import parse_messages
from server.defaults import CHAT, COMPLETIONS
from server.errors import BadRequest, NotImplementedFeature
from server.structured import StructuredOutput
from server.tool_syntax import GENERIC, ToolSyntax
from server.tools import parse_tools
from server.schemas import MAX_PROMPTS, check_combinations, choice_specs, read_n, read_sampling
from server.spec import ChatPrompt, GenerationSpec
from server.tiers import BATCH, INTERACTIVE
from server.validation import FieldReader


@dataclass(frozen=True)
class OpenAIRequest:
    """A validated /v1/completions or /v1/chat/completions body: the model it names, its choices
    (n per prompt, prompt by prompt) as the dialect-neutral specs every route submits, and what
    only the answer's shape needs."""

    model: str
    specs: list[GenerationSpec]
    include_usage: bool
    n: int = 1  # choices per prompt


def parse_completion(body: dict[str, Any], *, n_ctx: int, tier: str = BATCH) -> OpenAIRequest:
    fields = FieldReader(body)
    model = fields.string("model", non_empty=True)
    prompts = _completion_prompts(fields.raw("prompt", None))
    sampling = read_sampling(fields, n_ctx=n_ctx, defaults=COMPLETIONS, tier=tier, least_max_tokens=0)
    echo = fields.boolean("echo", False, nullable=True)
    if sampling["max_tokens"] == 0 and not echo:
        raise BadRequest("'max_tokens' 0 generates nothing: it only scores the prompt, with \"echo\": true",
                         param="max_tokens")
    stream, include_usage = _stream_fields(fields)
    _refuse_unsupported(fields, COMPLETION_UNSUPPORTED, COMPLETION_UNUSED)
    n = read_n(fields, sampling["max_tokens"], n_ctx)
    if n * len(prompts) > MAX_PROMPTS:
        raise BadRequest(f"{len(prompts)} prompts x n={n} is more than {MAX_PROMPTS} choices", param="n",
                         code="too_many_prompts")
    if body.get("logprobs") is False:  # some clients send false for "none"
        fields.raw("logprobs")
    logprobs = fields.integer("logprobs", None, minimum=0, maximum=MAX_LOGPROBS, nullable=True)
    token_ids = _return_token_ids(fields, stream)
    fields.finish()
    check_combinations(sampling, stream=stream, wants_logprobs=logprobs is not None,
                       structured_output=None, logprobs_param="logprobs")
    specs = [choice for prompt in prompts
             for choice in choice_specs(GenerationSpec(prompt=prompt, stream=stream, logprobs=logprobs or 0,
                                                       want_logprobs=logprobs is not None, echo=echo,
                                                       return_token_ids=token_ids, **sampling), n)]
    return OpenAIRequest(model, specs, include_usage, n)


def parse_chat(body: dict[str, Any], *, n_ctx: int, tier: str = INTERACTIVE,
               tool_syntax: ToolSyntax = GENERIC) -> OpenAIRequest:
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
    sampling = read_sampling(fields, n_ctx=n_ctx, defaults=CHAT, tier=tier)
    if body_max is not None:
        sampling["max_tokens"] = body_max
    stream, include_usage = _stream_fields(fields)
    response_format = structured.from_response_format(fields.raw("response_format", None))
    _refuse_unsupported(fields, CHAT_UNSUPPORTED, CHAT_UNUSED)
    n = read_n(fields, sampling["max_tokens"], n_ctx)
    logprobs = fields.boolean("logprobs", False, nullable=True)
    top_logprobs = fields.integer("top_logprobs", None, minimum=0, maximum=MAX_LOGPROBS, nullable=True)
    if top_logprobs is not None and not logprobs:
        raise BadRequest("'top_logprobs' needs \"logprobs\": true", param="top_logprobs")
    tools = parse_tools(fields.raw("tools", None), fields.raw("tool_choice", None),
                        fields.raw("parallel_tool_calls", None), tool_syntax)
    token_ids = _return_token_ids(fields, stream)
    fields.finish()
    structured_output, answer_format = response_format, None
    if tools is not None and tools.callable:
        _check_beside_calls(sampling)
        structured_output = StructuredOutput(tools.calls_json_schema(), source="tools")
        # Under "auto" an answer that calls nothing follows the format; "required" and a named
        # function always call, so the format does not apply to this turn.
        answer_format = response_format if tools.choice == "auto" else None
        if answer_format is not None and not tools.calls_opening:
            raise BadRequest("'response_format' cannot be combined with callable tools here: this model's calls "
                             "begin with no text that would tell them from the format's document",
                             param="response_format")
    check_combinations(sampling, stream=stream, wants_logprobs=logprobs, structured_output=structured_output,
                       logprobs_param="logprobs")
    spec = GenerationSpec(prompt=ChatPrompt(tuple(messages)), stream=stream, structured=structured_output,
                          logprobs=top_logprobs or 0, want_logprobs=logprobs, tools=tools,
                          answer_format=answer_format, return_token_ids=token_ids, **sampling)
    return OpenAIRequest(model, choice_specs(spec, n), include_usage, n)


def _return_token_ids(fields: FieldReader, stream: bool) -> bool:
    """vLLM's extension: each choice's generated token ids, for comparing outputs token by token."""
    wanted = bool(fields.boolean("return_token_ids", False, nullable=True))
    if wanted and stream:
        raise BadRequest("'return_token_ids' is served on answers that are not streamed", param="return_token_ids")
    return wanted


def _check_beside_calls(sampling: dict[str, Any]) -> None:
    """What cannot be honoured together with functions the output may call."""
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


# OpenAI fields this engine cannot honour: (the values that ask for nothing, the 501's message).
COMPLETION_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((None, 1), "'best_of' other than 1 is not supported by this engine"),
    "suffix": ((None, ""), "'suffix' (insertion) is not supported by this engine"),
}
CHAT_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "functions": ((None, []), "'functions' (the legacy form of tools) is not supported; send 'tools'"),
    "function_call": ((None, "none", "auto"), "'function_call' (the legacy form of tool_choice) is not "
                      "supported; send 'tool_choice'"),
    "audio": ((None,), "'audio' output is not supported: this engine generates text only"),
    "modalities": ((None, ["text"]), "'modalities' other than [\"text\"] is not supported: this engine "
                   "generates text only"),
    "prediction": ((None,), "'prediction' (Predicted Outputs) is not supported by this engine"),
    "web_search_options": ((None,), "'web_search_options' is not supported: this engine does not search the web"),
    "store": ((None, False), "'store' is not supported: this server keeps no chat completions (a batch job "
              "keeps its results: /v1/batches)"),
    "reasoning_effort": ((None, "none"), "'reasoning_effort' is not supported by this engine"),
    "verbosity": ((None, "medium"), "'verbosity' other than \"medium\" is not supported by this engine"),
    "prompt_cache_retention": ((None, "in_memory"), "'prompt_cache_retention' other than \"in_memory\" is not "
                               "supported: this engine's prefix cache is in memory only"),
    "prompt_cache_options": ((None, {}), "'prompt_cache_options' is not supported: this engine's prefix cache "
                             "is automatic, without breakpoints or lifetimes"),
    "moderation": ((None,), "'moderation' is not supported: this engine runs no moderation model"),
}
# Fields that ask for nothing of the engine (who the caller is, tags for stored completions, a
# cache key the prefix cache does without): read as their type ("string" or "object"), unused.
COMPLETION_UNUSED = {"user": "string"}
CHAT_UNUSED = {"user": "string", "safety_identifier": "string", "prompt_cache_key": "string", "metadata": "object"}


def _refuse_unless(fields: FieldReader, name: str, harmless: tuple, message: str) -> None:
    """Accept a field only with a value that asks for nothing (its default); else 501."""
    if fields.present(name) and fields.raw(name) not in harmless:
        raise NotImplementedFeature(message, param=name)


def _refuse_unsupported(fields: FieldReader, unsupported: dict[str, tuple[tuple[Any, ...], str]],
                        unused: dict[str, str]) -> None:
    """OpenAI's fields that ask for something this engine does not do are refused with 501 naming
    it (not as unknown fields); those that ask for nothing are read, and nothing is done with them."""
    for name, kind in unused.items():
        getattr(fields, kind)(name, None, nullable=True)
    for name, (harmless, message) in unsupported.items():
        _refuse_unless(fields, name, harmless, message)
