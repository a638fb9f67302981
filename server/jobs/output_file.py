"""A finished batch's output and error files, in OpenAI's line format:

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"}, "error": null}

Answers with status 200 go to the output file, every other outcome to the error file (a 4xx
answer with its body, or `"response": null` and an error for a request that never ran), so
each custom_id of the input appears exactly once across the two. Both are written a page of
results at a time, straight from the stored JSON text: memory stays bounded whatever the batch's
size, and no large body is parsed again.
"""
from __future__ import annotations

import hashlib
import json
import time

from server.jobs.disk import PartFile
from server.jobs.store import JobStore, Outcome, StoredFile, StoredOutcome, to_json

OUTPUT_PURPOSE = "batch_output"
PAGE = 500  # results read from the store at a time


def encode_line(batch_id: str, custom_id: str, line: int, status_code: int | None, request_id: str | None,
                response_json: str | None, error_json: str | None) -> bytes:
    """One line of an output or error file (newline included), from the result's JSON text."""
    digest = hashlib.sha256(f"{batch_id}/{line}".encode()).hexdigest()[:24]
    response = "null"
    if status_code is not None:
        response = (f'{{"status_code": {int(status_code)}, "request_id": {json.dumps(request_id)}, '
                    f'"body": {response_json or "null"}}}')
    text = (f'{{"id": "batch_req_{digest}", "custom_id": {json.dumps(custom_id, ensure_ascii=False)}, '
            f'"response": {response}, "error": {error_json or "null"}}}\n')
    return text.encode()


def outcome_line(batch_id: str, custom_id: str, line: int, outcome: Outcome) -> bytes:
    """encode_line for an outcome in hand (the offline runner's)."""
    return encode_line(batch_id, custom_id, line, outcome.status_code, outcome.request_id,
                       to_json(outcome.response), to_json(outcome.error))


def write_outputs(store: JobStore, batch_id: str, page: int = PAGE) -> tuple[str | None, str | None]:
    """Write both files (ids derived from the batch, so a second write replaces the first) and
    record them for the batch's owner; None for a file that would be empty."""
    owner = store.batch_row(batch_id)["owner"]
    kinds = ("output", "errors")
    ids = {kind: f"file-{batch_id}-{kind}" for kind in kinds}
    files = {kind: PartFile(store.file_path(ids[kind])) for kind in kinds}
    try:
        after = -1
        while rows := store.outcome_page(batch_id, after, page):
            for row in rows:
                files["output" if row.status_code == 200 else "errors"].write(_encoded(batch_id, row))
            after = rows[-1].line
        written: dict[str, str | None] = {}
        for kind in kinds:
            if files[kind].size == 0:
                files[kind].abort()
                written[kind] = None
                continue
            size = files[kind].commit()
            store.add_file_row(StoredFile(ids[kind], OUTPUT_PURPOSE, f"{batch_id}_{kind}.jsonl", size,
                                          int(time.time()), owner))
            written[kind] = ids[kind]
    except BaseException:
        for part in files.values():
            part.abort()
        raise
    return written["output"], written["errors"]


def _encoded(batch_id: str, row: StoredOutcome) -> bytes:
    return encode_line(batch_id, row.custom_id, row.line, row.status_code, row.request_id, row.response_json,
                       row.error_json)
