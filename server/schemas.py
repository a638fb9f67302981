"""Validation of the native `POST /generate` body into a GenerationSpec.

Fields (all but `prompt` optional; the sampling fields' defaults are server/defaults.py GENERATE,
shown in docs/http-api.md's "Sampling defaults"):
  prompt              non-empty string, or a list of them (one choice each, at most 256)
  n                   integer 1..16                    (default 1: choices per prompt; the prompt is
                                                        computed once; with a seed, choice i > 0
                                                        samples with a seed derived from (seed, i))
  priority            "interactive" | "batch"         (default: the route's, --default-tier;
                                                        wins over service_tier)
  service_tier        "auto" | "default" | "flex" | "priority"  (OpenAI's names: flex is batch,
                                                        priority is interactive; docs/tiers.md)
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
  speculative         boolean                          (default true: drafted tokens are verified
                                                        where they pay, docs/speculative-decoding.md;
                                                        false: never for this request)
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from engine.request import MAX_LOGPROBS
from sampling.params import PENALTY_LIMIT
from server import structured
from server.defaults import GENERATE, SamplingDefaults
from server.errors import BadRequest
from server.tiers import BATCH, read_tier
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

def read_sampling(fields: FieldReader, *, n_ctx: int, defaults: SamplingDefaults, tier: str,
                  least_max_tokens: int = 1) -> dict[str, Any]:
    """The sampling and length fields every generation API shares, `defaults` for those left out
    (max_tokens 0 only where the caller checks what it means: scoring a prompt with echo), and
    the tier served (`tier` when the request names none)."""
    return {
        "max_tokens": fields.integer("max_tokens", defaults.max_tokens, minimum=least_max_tokens, maximum=n_ctx,
                                     nullable=True),
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
        "priority": read_tier(fields, tier),
        "timeout": fields.number("timeout", None, minimum=0.0, exclusive_minimum=True,
                                 maximum=MAX_TIMEOUT_S, nullable=True),
        "ignore_eos": fields.boolean("ignore_eos", False, nullable=True),
        "open_objects": fields.boolean("open_objects", False, nullable=True),
        "speculative": fields.boolean("speculative", True, nullable=True),
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


def parse_generate(body: dict[str, Any], *, n_ctx: int, tier: str = BATCH) -> list[GenerationSpec]:
    """The choices: n per prompt, prompt by prompt (one, for a plain request); `tier` for a
    request that names none."""
    fields = FieldReader(body)
    prompts = _generate_prompts(fields.raw("prompt", None))
    sampling = read_sampling(fields, n_ctx=n_ctx, defaults=GENERATE, tier=tier)
    n = read_n(fields, sampling["max_tokens"], n_ctx)
    if n * len(prompts) > MAX_PROMPTS:
        raise BadRequest(f"{len(prompts)} prompts x n={n} is more than {MAX_PROMPTS} choices", param="n",
                         code="too_many_prompts")
    output_format = fields.string("format", None, choices=("raw", "json"), nullable=True)  # None: not given
    json_schema = fields.raw("json_schema", None)
    logprobs = fields.integer("logprobs", None, minimum=0, maximum=MAX_LOGPROBS, nullable=True)
    stream = fields.boolean("stream", False, nullable=True)
    fields.finish()
    structured_output = structured.from_generate_fields(output_format, json_schema)
    check_combinations(sampling, stream=stream, wants_logprobs=logprobs is not None,
                       structured_output=structured_output, logprobs_param="logprobs")
    return [choice for prompt in prompts
            for choice in choice_specs(GenerationSpec(prompt=prompt, stream=stream, structured=structured_output,
                                                      logprobs=logprobs or 0, want_logprobs=logprobs is not None,
                                                      **sampling), n)]


def _generate_prompts(value: Any) -> list[str]:
    if not isinstance(value, list):
        body = {} if value is None else {"prompt": value}
        return [FieldReader(body).string("prompt", non_empty=True)]
    if len(value) > MAX_PROMPTS:
        raise BadRequest(f"'prompt' lists at most {MAX_PROMPTS} prompts (got {len(value)}); send more as a batch "
                         "job (/v1/batches)", param="prompt", code="too_many_prompts")
    if not value:
        raise BadRequest("'prompt' must not be an empty list", param="prompt")
    return [FieldReader({f"prompt[{i}]": p}).string(f"prompt[{i}]", non_empty=True) for i, p in enumerate(value)]


MAX_PROMPTS = 256  # choices in one request (prompts x n); more belong in a batch job (/v1/batches)
MAX_N = 16  # choices per prompt


def read_n(fields: FieldReader, max_tokens: int, n_ctx: int) -> int:
    """Choices per prompt. Their prompt is computed once and shared through the prefix cache;
    what each generates needs cells of its own, so n * max_tokens must fit in the cache."""
    n = fields.integer("n", 1, minimum=1, maximum=MAX_N, nullable=True) or 1
    if n > 1 and n * max_tokens > n_ctx:
        raise BadRequest(f"n={n} choices of up to {max_tokens} tokens need {n * max_tokens} KV cells; the cache "
                         f"holds {n_ctx}: lower n or max_tokens", param="n", code="n_too_large")
    return n


def choice_specs(spec: GenerationSpec, n: int) -> list[GenerationSpec]:
    """n choices of one spec; with a seed s, choice 0 keeps s and choice i > 0 gets a seed derived
    from (s, i): reproducible, and different from each other."""
    if n == 1 or spec.seed is None:
        return [spec] * n
    return [spec] + [replace(spec, seed=_derived_seed(spec.seed, i)) for i in range(1, n)]


def _derived_seed(seed: int, i: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{i}".encode()).digest()[:8], "big") >> 1

