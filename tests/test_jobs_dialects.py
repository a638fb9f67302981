"""Batch lines in the agent dialects: /v1/responses and /v1/messages batches on a real `cobatch
serve` (answers in each dialect's shape, tool calls valid against their schemas, refusals in the
dialect's error shape in the error file, nothing stored by a Responses line), and `cobatch batch`
running lines of all four routes from one file."""
from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import jsonschema
import openai
import pytest

from server.responses_store import DATABASE
from tests.server_fixtures import serve_process
from tests.test_jobs_server import _lines, _wait_for

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[1]
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
ASK = "What is the weather in Paris?"
RESPONSES_LINES = {
    "text": {"input": "Say hello.", "max_output_tokens": 8, "temperature": 0},
    "call": {"input": ASK, "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}],
             "tool_choice": "required", "parallel_tool_calls": False, "max_output_tokens": 60, "temperature": 0},
    "store": {"input": "Hi", "store": True},
    "previous": {"input": "Hi", "previous_response_id": "resp_1"},
    "stream": {"input": "Hi", "stream": True},
    "malformed": {"input": [{"type": "reasoning"}]},
}
MESSAGES_LINES = {
    "text": {"max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}], "temperature": 0},
    "call": {"max_tokens": 60, "messages": [{"role": "user", "content": ASK}], "temperature": 0,
             "tools": [{"name": "get_weather", "input_schema": PARAMS}], "tool_choice": {"type": "any"}},
    "no max_tokens": {"messages": [{"role": "user", "content": "Hi"}]},
    "stream": {"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "stream": True},
}


def jsonl(url: str, model: str | None, bodies: dict[str, dict]) -> bytes:
    named = {"model": model} if model else {}
    return "".join(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": {**named, **body}}) + "\n"
                   for cid, body in bodies.items()).encode()


def run_batch(client: openai.OpenAI, url: str, model: str, bodies: dict[str, dict]) -> dict[str, dict]:
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(url, model, bodies))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=url, completion_window="24h")
    batch = _wait_for(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    lines = _lines(client, batch.output_file_id) + _lines(client, batch.error_file_id)
    assert sorted(x["custom_id"] for x in lines) == sorted(bodies)
    return {x["custom_id"]: x["response"] for x in lines}


def check_responses_answers(by_id: dict[str, dict]) -> None:
    text, call = by_id["text"]["body"], by_id["call"]["body"]
    assert by_id["text"]["status_code"] == 200 and text["object"] == "response" and text["store"] is False
    assert text["output"][0]["content"][0]["text"] and text["service_tier"] == "flex"  # a batch line's tier
    (item,) = call["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    jsonschema.validate(json.loads(item["arguments"]), PARAMS)
    for cid, param in [("store", "store"), ("previous", "previous_response_id"), ("stream", "stream"),
                       ("malformed", "input[0].type")]:
        assert by_id[cid]["status_code"] == 400 and by_id[cid]["body"]["error"]["param"] == param, by_id[cid]


def check_messages_answers(by_id: dict[str, dict]) -> None:
    text, call = by_id["text"]["body"], by_id["call"]["body"]
    assert by_id["text"]["status_code"] == 200 and text["type"] == "message" and text["content"][0]["text"]
    assert call["stop_reason"] == "tool_use" and call["content"][0]["type"] == "tool_use"
    jsonschema.validate(call["content"][0]["input"], PARAMS)
    for cid in ("no max_tokens", "stream"):
        body = by_id[cid]["body"]
        assert by_id[cid]["status_code"] == 400 and body["type"] == "error", body  # Anthropic's shape
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]


def test_responses_and_messages_batches_answer_in_their_dialects(tmp_path):
    with serve_process("--n-ctx", "2048", "--data-dir", str(tmp_path)) as (_, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        check_responses_answers(run_batch(client, "/v1/responses", model, RESPONSES_LINES))
        check_messages_answers(run_batch(client, "/v1/messages", model, MESSAGES_LINES))
        with sqlite3.connect(f"file:{tmp_path / DATABASE}?mode=ro", uri=True) as db:
            assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 0  # a batch keeps no responses


def test_cobatch_batch_runs_lines_of_every_route_from_one_file(tmp_path):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    chat = {"chat": {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6}}
    completion = {"completion": {"prompt": "Count to three:", "max_tokens": 6}}
    source.write_bytes(jsonl("/v1/chat/completions", None, chat) + jsonl("/v1/completions", None, completion)
                       + jsonl("/v1/responses", None, {"text": RESPONSES_LINES["text"]})
                       + jsonl("/v1/messages", None, {"message": MESSAGES_LINES["text"],
                                                      "no max_tokens": MESSAGES_LINES["no max_tokens"]}))
    proc = subprocess.run([sys.executable, "-m", "server.cli", "batch", str(source), "-o", str(output),
                           "--n-ctx", "2048"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr
    by_id = {x["custom_id"]: x["response"] for x in map(json.loads, output.read_text().splitlines())}
    assert [by_id[c]["status_code"] for c in ("chat", "completion", "text", "message", "no max_tokens")] == [
        200, 200, 200, 200, 400]
    assert by_id["chat"]["body"]["object"] == "chat.completion"
    assert by_id["completion"]["body"]["object"] == "text_completion"
    assert by_id["text"]["body"]["object"] == "response" and by_id["text"]["body"]["store"] is False
    assert by_id["message"]["body"]["type"] == "message"
    assert by_id["no max_tokens"]["body"]["type"] == "error"
    assert "5/5 (100%)" in proc.stderr
