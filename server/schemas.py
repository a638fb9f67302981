"""Validation of the native `POST /generate` body into a GenerationSpec.

Fields (all but `prompt` optional; the sampling fields' defaults are server/defaults.py GENERATE,
shown in server/README.md's "Sampling defaults"):
  prompt              non-empty string
  priority            "interactive" | "batch"
  timeout             seconds > 0, at most 86400       (default none; past it the request ends
                                                        with HTTP 504, or finish_reason "timeout"
                                                        in a stream)
  format              "raw" | "json"                   (default "raw", or "json" when json_schema
                                                        is given; "json" alone: any JSON object)
  json_schema         JSON Schema object; the output is constrained to it (implies format "json";
                                                        an explicit "raw" beside it is refused)
  max_tokens          integer 1..n_ctx
  temperature         number 0..2                      (0 is greedy)
  top_p               number in (0, 1]                 (1 disables it)
  top_k               integer >= 0                     (0 disables it)
  min_p               number 0..1                      (0: off)
  repetition_penalty  number > 0                       (1: off)
  presence_penalty    number -2..2                     (0: off)
  frequency_penalty   number -2..2                     (0: off)
  logit_bias          {"<token id>": -100..100, ...}   (default none)
  logprobs            integer 0..20 or null            (default null: none; n: each token's
                                                        logprob and the n most likely tokens)
  stop                string or list of strings        (default none; not with format "json")
  seed                integer >= 0 or null             (null: random)
  stream              boolean                          (default false; not with logprobs)
  open_objects        boolean                          (default false: an absent additionalProperties
                                                        allows no other members; true: any, as JSON
                                                        Schema says, and small objects' members in
                                                        any order; needs a json_schema)
  ignore_eos          boolean                          (default false; true: generate past
                                                        end-of-generation tokens until max_tokens,
                                                        as llama-server and vLLM allow; benchmarks)
"""
from __future__ import annotations

from typing import Any

from engine.request import MAX_LOGPROBS
from sampling.params import PENALTY_LIMIT
from server import structured
from server.defaults import GENERATE, SamplingDefaults
from server.errors import BadRequest
from server.spec import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_STOP_LENGTH,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    GenerationSpec,
)
from server.validation import FieldReader

PRIORITIES = ("interactive", "batch")


def read_sampling(fields: FieldReader, *, n_ctx: int, defaults: SamplingDefaults) -> dict[str, Any]:
    """The sampling and length fields every generation API shares, `defaults` for those left out."""
    return {
        "max_tokens": fields.integer("max_tokens", defaults.max_tokens, minimum=1, maximum=n_ctx, nullable=True),
        "temperature": fields.number(
            "temperature", defaults.temperature, minimum=0.0, maximum=MAX_TEMPERATURE, nullable=True
        ),
        "top_p": fields.number(
            "top_p", defaults.top_p, minimum=0.0, maximum=1.0, exclusive_minimum=True, nullable=True
        ),
        "top_k": fields.integer("top_k", defaults.top_k, minimum=0, nullable=True),
        "min_p": fields.number("min_p", defaults.min_p, minimum=0.0, maximum=1.0, nullable=True),
        "repetition_penalty": fields.number(
            "repetition_penalty", defaults.repetition_penalty, minimum=0.0, exclusive_minimum=True, nullable=True
        ),
        "presence_penalty": fields.number(
            "presence_penalty", defaults.presence_penalty, minimum=-PENALTY_LIMIT, maximum=PENALTY_LIMIT,
            nullable=True,
        ),
        "frequency_penalty": fields.number(
            "frequency_penalty", defaults.frequency_penalty, minimum=-PENALTY_LIMIT, maximum=PENALTY_LIMIT,
            nullable=True,
        ),
        "logit_bias": fields.logit_bias(max_entries=MAX_LOGIT_BIAS_ENTRIES),
        "seed": fields.integer("seed", defaults.seed, minimum=0, maximum=MAX_SEED, nullable=True),
        "stop": fields.stop_strings("stop", max_count=MAX_STOP_STRINGS, max_length=MAX_STOP_LENGTH),
        "priority": fields.string("priority", defaults.priority, choices=PRIORITIES, nullable=True),
        "timeout": fields.number("timeout", None, minimum=0.0, exclusive_minimum=True,
                                 maximum=MAX_TIMEOUT_S, nullable=True),
        "ignore_eos": fields.boolean("ignore_eos", False, nullable=True),
        "open_objects": fields.boolean("open_objects", False, nullable=True),
    }


def check_combinations(sampling: dict[str, Any], *, stream: bool, wants_logprobs: bool,
                       structured_output: structured.StructuredOutput | None, logprobs_param: str) -> None:
    """Options that are valid alone but not together, refused before anything is queued."""
    if structured_output is not None and sampling["stop"]:
        raise BadRequest(
            f"'stop' cannot be combined with JSON output ('{structured_output.source}'): a stop string "
            "would cut the document short",
            param="stop",
        )
    if structured_output is not None and sampling["ignore_eos"]:
        raise BadRequest(
            f"'ignore_eos' cannot be combined with JSON output ('{structured_output.source}'): the "
            "output ends when the document is complete",
            param="ignore_eos",
        )
    if sampling["open_objects"] and (structured_output is None or structured_output.schema is None):
        raise BadRequest("'open_objects' applies to a JSON Schema ('json_schema', or 'response_format' of type "
                         "json_schema); none was given", param="open_objects")
    if stream and wants_logprobs:
        raise BadRequest(
            f"'{logprobs_param}' is not supported with \"stream\": true; send the request without streaming",
            param=logprobs_param,
        )


def parse_generate(body: dict[str, Any], *, n_ctx: int) -> GenerationSpec:
    fields = FieldReader(body)
    prompt = fields.string("prompt", non_empty=True)
    sampling = read_sampling(fields, n_ctx=n_ctx, defaults=GENERATE)
    output_format = fields.string("format", None, choices=("raw", "json"), nullable=True)  # None: not given
    json_schema = fields.raw("json_schema", None)
    logprobs = fields.integer("logprobs", None, minimum=0, maximum=MAX_LOGPROBS, nullable=True)
    stream = fields.boolean("stream", False, nullable=True)
    fields.finish()
    structured_output = structured.from_generate_fields(output_format, json_schema)
    check_combinations(sampling, stream=stream, wants_logprobs=logprobs is not None,
                       structured_output=structured_output, logprobs_param="logprobs")
    return GenerationSpec(prompt=prompt, stream=stream, structured=structured_output,
                          logprobs=logprobs or 0, want_logprobs=logprobs is not None, **sampling)
