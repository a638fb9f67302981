"""Reading a batch input file: one request per line, checked as OpenAI checks them.

A line that is not a request at all (not JSON, no custom_id, another endpoint, a repeated
custom_id) fails the whole batch at validation with OpenAI's `errors` list, naming the line. A
well-formed line whose body the route would refuse is not checked here: it runs, and its 4xx
answer goes to the error file like any other.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_REQUESTS = 50_000  # per batch, as OpenAI's
MAX_ERRORS_LISTED = 100


class InputProblem(NamedTuple):
    code: str
    message: str
    line: int | None = None  # 1-based, as OpenAI counts
    param: str | None = None

    def as_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


class InputRequest(NamedTuple):
    custom_id: str
    url: str
    body: dict[str, Any]


def read_requests(path: Path, endpoint: str | None) -> tuple[list[InputRequest], list[InputProblem]]:
    """Every line's request, or the problems that fail the batch. With an endpoint, every line
    must name it (a server batch); without, each line may name either (the offline runner)."""
    requests: list[InputRequest] = []
    problems: list[InputProblem] = []
    seen: set[str] = set()
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue  # a blank line (a trailing newline, say) is not a request
            request, problem = _parse_line(raw, number, endpoint)
            if problem is None and request.custom_id in seen:
                problem = InputProblem("duplicate_custom_id", f"custom_id {request.custom_id!r} appears more than once; "
                                       "each request needs its own", number, "custom_id")
            if problem is not None:
                problems.append(problem)
                if len(problems) >= MAX_ERRORS_LISTED:
                    break
                continue
            seen.add(request.custom_id)
            requests.append(request)
            if len(requests) > MAX_REQUESTS:
                return [], [InputProblem("too_many_requests", f"a batch holds at most {MAX_REQUESTS} requests")]
    if not requests and not problems:
        problems.append(InputProblem("empty_file", "the input file holds no requests"))
    return requests, problems


def _parse_line(raw: bytes, number: int, endpoint: str | None) -> tuple[Any, InputProblem | None]:
    try:
        line = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, InputProblem("invalid_json_line", f"line {number} is not valid JSON: {exc}", number)
    if not isinstance(line, dict):
        return None, InputProblem("invalid_json_line", f"line {number} is not a JSON object", number)
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, InputProblem("missing_required_parameter", "each line needs a non-empty string custom_id",
                                  number, "custom_id")
    if line.get("method") != "POST":
        return None, InputProblem("invalid_request", f"method must be POST, got {line.get('method')!r}", number,
                                  "method")
    url = line.get("url")
    if url not in ENDPOINTS or endpoint not in (None, url):
        why = f"this batch's endpoint is {endpoint}" if url in ENDPOINTS else f"supported: {', '.join(ENDPOINTS)}"
        return None, InputProblem("invalid_url", f"url {url!r} cannot run in this batch ({why})", number, "url")
    body = line.get("body")
    if not isinstance(body, dict):
        return None, InputProblem("invalid_request", "body must be a JSON object", number, "body")
    unknown = sorted(set(line) - {"custom_id", "method", "url", "body"})
    if unknown:
        return None, InputProblem("invalid_request", f"unknown field(s) {', '.join(unknown)}", number, unknown[0])
    return InputRequest(custom_id, url, body), None
