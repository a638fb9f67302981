"""Validation of the native `POST /generate` body into a GenerationSpec.

Fields (all but `prompt` optional):
  prompt       non-empty string
  priority     "interactive" | "batch"            (default "batch")
  format       "raw" | "json"                      (default "raw"; "json" is 501 until the engine has it)
  json_schema  JSON Schema object, implies nothing by itself: needs format "json"
  max_tokens   integer 1..n_ctx                    (default 512)
  temperature  number 0..2                         (default 0.7; 0 is greedy)
  top_p        number in (0, 1]                    (default 0.9; 1 disables it)
  top_k        integer >= 0                        (default 40; 0 disables it)
  stop         string or list of strings           (default none)
  seed         integer >= 0 or null                (default null: random)
  stream       boolean                             (default false)
"""
from __future__ import annotations

from typing import Any

from server import structured
from server.spec import MAX_SEED, MAX_STOP_LENGTH, MAX_STOP_STRINGS, MAX_TEMPERATURE, GenerationSpec
from server.validation import FieldReader

PRIORITIES = ("interactive", "batch")


def read_sampling(fields: FieldReader, *, n_ctx: int, defaults: dict[str, Any]) -> dict[str, Any]:
    """The sampling and length fields every generation API shares."""
    return {
        "max_tokens": fields.integer("max_tokens", defaults["max_tokens"], minimum=1, maximum=n_ctx, nullable=True),
        "temperature": fields.number(
            "temperature", defaults["temperature"], minimum=0.0, maximum=MAX_TEMPERATURE, nullable=True
        ),
        "top_p": fields.number(
            "top_p", defaults["top_p"], minimum=0.0, maximum=1.0, exclusive_minimum=True, nullable=True
        ),
        "top_k": fields.integer("top_k", defaults["top_k"], minimum=0, nullable=True),
        "seed": fields.integer("seed", None, minimum=0, maximum=MAX_SEED, nullable=True),
        "stop": fields.stop_strings("stop", max_count=MAX_STOP_STRINGS, max_length=MAX_STOP_LENGTH),
        "priority": fields.string("priority", "batch", choices=PRIORITIES, nullable=True),
    }


GENERATE_DEFAULTS = {"max_tokens": 512, "temperature": 0.7, "top_p": 0.9, "top_k": 40}


def parse_generate(body: dict[str, Any], *, n_ctx: int) -> GenerationSpec:
    fields = FieldReader(body)
    prompt = fields.string("prompt", non_empty=True)
    sampling = read_sampling(fields, n_ctx=n_ctx, defaults=GENERATE_DEFAULTS)
    output_format = fields.string("format", "raw", choices=("raw", "json"), nullable=True)
    json_schema = fields.raw("json_schema", None)
    stream = fields.boolean("stream", False, nullable=True)
    fields.finish()
    structured_output = structured.from_generate_fields(output_format, json_schema)
    return GenerationSpec(prompt=prompt, stream=stream, structured=structured_output, **sampling)
