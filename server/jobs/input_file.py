"""Reading a batch input file: one request per line, checked as OpenAI checks them.

A line that is not a request at all (not JSON, no custom_id, another endpoint, a repeated
custom_id) fails the whole batch at validation with OpenAI's `errors` list, naming the line. So
does a line the JSON parser must not be given: longer than MAX_LINE_BYTES or nested deeper than
MAX_DEPTH (a hostile line of a thousand brackets is a line error, never a crash). A well-formed
line whose body the route would refuse is not checked here: it runs, and its 4xx answer goes to
the error file like any other.

The file is read line by line, twice for a server batch (check, then store), so a large upload
is never held in memory whole.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any, Iterator, NamedTuple

# OpenAI's Batch API takes /v1/responses lines too; /v1/messages lines run Anthropic's dialect.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
MAX_REQUESTS = 50_000  # per batch, as OpenAI's
MAX_ERRORS_LISTED = 100
MAX_LINE_BYTES = 4 * 1024 * 1024  # far above any context's worth of text
MAX_DEPTH = 128  # nesting of objects and arrays; Python's parser itself gives up near 1,000


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
    index: int  # 0-based among the file's requests (blank lines skipped): stable across runs


def check_requests(path: Path, endpoint: str | None) -> tuple[int, list[InputProblem]]:
    """How many requests the file holds, or the problems that fail the batch. With an endpoint,
    every line must name it (a server batch); without, each line may name either (offline)."""
    problems: list[InputProblem] = []
    seen: set[str] = set()
    for number, item in _parsed(path, endpoint):
        if isinstance(item, InputRequest) and item.custom_id in seen:
            item = InputProblem("duplicate_custom_id", f"custom_id {item.custom_id!r} appears more than once; "
                                "each request needs its own", number, "custom_id")
        if isinstance(item, InputProblem):
            problems.append(item)
            if len(problems) >= MAX_ERRORS_LISTED:
                break
            continue
        seen.add(item.custom_id)
        if len(seen) > MAX_REQUESTS:
            return 0, [InputProblem("too_many_requests", f"a batch holds at most {MAX_REQUESTS} requests")]
    if not seen and not problems:
        problems.append(InputProblem("empty_file", "the input file holds no requests"))
    return len(seen), problems


def iter_requests(path: Path, endpoint: str | None) -> Iterator[InputRequest]:
    """The requests of a file that check_requests found sound, one at a time."""
    for _, item in _parsed(path, endpoint):
        if isinstance(item, InputProblem):
            raise ValueError(f"line {item.line} changed since it was checked: {item.message}")
        yield item


def read_requests(path: Path, endpoint: str | None) -> tuple[list[InputRequest], list[InputProblem]]:
    """Every line's request, or the problems that fail the batch."""
    _, problems = check_requests(path, endpoint)
    return ([], problems) if problems else (list(iter_requests(path, endpoint)), [])


def _parsed(path: Path, endpoint: str | None) -> Iterator[tuple[int, InputRequest | InputProblem]]:
    index = 0
    with open(path, "rb") as lines:
        for number, raw in _lines(lines):
            if raw is None:
                yield number, InputProblem("invalid_json_line", f"line {number} is longer than {MAX_LINE_BYTES} "
                                           "bytes", number)
                continue
            if not raw.strip():
                continue  # a blank line (a trailing newline, say) is not a request
            item = _parse_line(raw, number, endpoint, index)
            if isinstance(item, InputRequest):
                index += 1
            yield number, item


def _lines(f: IO[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """(1-based number, bytes) of each line; None for a line over MAX_LINE_BYTES, skipped unread."""
    number = 0
    while raw := f.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield number, None
            continue
        yield number, raw


def _depth_over(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest deeper than `limit` (no recursion: the value may be deep)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _parse_line(raw: bytes, number: int, endpoint: str | None, index: int) -> InputRequest | InputProblem:
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8; RecursionError: too deep
        why = "nested too deeply for the parser" if isinstance(exc, RecursionError) else str(exc)
        return InputProblem("invalid_json_line", f"line {number} is not valid JSON: {why}", number)
    if _depth_over(line, MAX_DEPTH):
        return InputProblem("invalid_json_line", f"line {number} nests objects and arrays more than {MAX_DEPTH} "
                            "deep", number)
    if not isinstance(line, dict):
        return InputProblem("invalid_json_line", f"line {number} is not a JSON object", number)
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return InputProblem("missing_required_parameter", "each line needs a non-empty string custom_id",
                            number, "custom_id")
    if line.get("method") != "POST":
        return InputProblem("invalid_request", f"method must be POST, got {line.get('method')!r}", number, "method")
    url = line.get("url")
    if url not in ENDPOINTS or endpoint not in (None, url):
        why = f"this batch's endpoint is {endpoint}" if url in ENDPOINTS else f"supported: {', '.join(ENDPOINTS)}"
        return InputProblem("invalid_url", f"url {url!r} cannot run in this batch ({why})", number, "url")
    body = line.get("body")
    if not isinstance(body, dict):
        return InputProblem("invalid_request", "body must be a JSON object", number, "body")
    unknown = sorted(set(line) - {"custom_id", "method", "url", "body"})
    if unknown:
        return InputProblem("invalid_request", f"unknown field(s) {', '.join(unknown)}", number, unknown[0])
    return InputRequest(custom_id, url, body, index)
