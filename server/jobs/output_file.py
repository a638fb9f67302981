"""A finished batch's output and error files, in OpenAI's line format:

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"}, "error": null}

Answers with status 200 go to the output file, every other outcome to the error file (a 4xx
answer with its body, or `"response": null` and an error for a request that never ran), so
each custom_id of the input appears exactly once across the two.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

from server.jobs.store import JobStore, Outcome

OUTPUT_PURPOSE = "batch_output"


def output_line(batch_id: str, custom_id: str, line: int, outcome: Outcome) -> dict[str, Any]:
    digest = hashlib.sha256(f"{batch_id}/{line}".encode()).hexdigest()[:24]
    response = None
    if outcome.status_code is not None:
        response = {"status_code": outcome.status_code, "request_id": outcome.request_id, "body": outcome.response}
    return {"id": f"batch_req_{digest}", "custom_id": custom_id, "response": response, "error": outcome.error}


def write_outputs(store: JobStore, batch_id: str) -> tuple[str | None, str | None]:
    """Write both files (ids derived from the batch, so a second write replaces the first);
    None for a file that would be empty."""
    ok: list[bytes] = []
    failed: list[bytes] = []
    for custom_id, line, outcome in store.outcomes(batch_id):
        encoded = (json.dumps(output_line(batch_id, custom_id, line, outcome), ensure_ascii=False) + "\n").encode()
        (ok if outcome.status_code == 200 else failed).append(encoded)
    ids = []
    for kind, lines in (("output", ok), ("errors", failed)):
        if not lines:
            ids.append(None)
            continue
        file_id = f"file-{batch_id}-{kind}"
        store.add_file(OUTPUT_PURPOSE, f"{batch_id}_{kind}.jsonl", _chunks(lines), file_id=file_id)
        ids.append(file_id)
    return ids[0], ids[1]


def _chunks(lines: list[bytes]) -> Iterator[bytes]:
    yield from lines
