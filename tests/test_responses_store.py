"""Stored responses without a model: the SQLite store (owners, tombstones, a reopened store), the
keeper in front of it when the store cannot write (held, found, written later; nothing changed
by a refused delete), the listed input items, and a continuation's items read back through the
parser as the conversation they stand for."""
from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.responses import ResponseItem
from pydantic import TypeAdapter

from server.errors import BadRequest, ServiceUnavailable
from server.responses_items import continued_items, listed_items
from server.responses_keeper import MAX_UNSAVED, ResponseKeeper
from server.responses_schemas import parse_responses_body
from server.responses_store import ResponseStore, StoredResponse
from tests.store_faults import FaultyStore

ITEMS = TypeAdapter(list[ResponseItem])
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
        "arguments": '{"city": "Paris"}', "status": "completed"}
ASKED = [{"id": "msg_q", "type": "message", "role": "user", "status": "completed",
          "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]
ANSWER = {"id": "msg_a", "type": "message", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "Sunny.", "annotations": [], "logprobs": []}]}


def stored(response_id: str = "resp_1", owner: str = "anonymous", output: list | None = None,
           items: list | None = None) -> StoredResponse:
    response = {"id": response_id, "object": "response", "created_at": 1, "output": output or [ANSWER]}
    return StoredResponse(response_id, owner, response, items or ASKED)


# ---------------------------------------------------------------- the store
def test_a_stored_response_is_found_by_its_owner_only_and_survives_a_reopen(tmp_path):
    store = ResponseStore(tmp_path)
    store.put(stored(owner="key-a"))
    assert store.get("resp_1", owner="key-a").response["output"] == [ANSWER]
    assert store.get("resp_1", owner="key-b") is None
    assert store.get("resp_1").owner == "key-a"  # an admin's lookup (no owner) sees every response
    store.close()
    again = ResponseStore(tmp_path)
    assert again.get("resp_1", owner="key-a") == stored(owner="key-a")
    again.close()


def test_delete_leaves_a_tombstone_and_touches_nothing_else(tmp_path):
    store = ResponseStore(tmp_path)
    store.put(stored("resp_1"))
    store.put(stored("resp_2"))
    assert not store.delete("resp_1", owner="someone-else")
    assert store.get("resp_1") is not None and not store.was_deleted("resp_1")
    assert store.delete("resp_1", owner="anonymous")
    assert store.get("resp_1") is None and store.was_deleted("resp_1", owner="anonymous")
    assert not store.was_deleted("resp_1", owner="someone-else")
    assert not store.delete("resp_1")
    assert store.get("resp_2") == stored("resp_2")
    store.close()


# ---------------------------------------------------------------- the keeper when the store fails
def test_a_response_the_store_cannot_take_is_held_found_and_written_later(tmp_path):
    async def run() -> None:
        faulty = FaultyStore(ResponseStore(tmp_path), {"outage": [0, 0.3], "error": "full"})
        keeper = ResponseKeeper(faulty)
        assert await keeper.keep(stored("resp_1"))
        assert await keeper.keep(stored("resp_2"))  # joins the held one without waiting on the store
        assert keeper.health()["held"] == 2 and "cannot write" in keeper.health()["reason"]
        assert (await keeper.find("resp_1", "anonymous")).id == "resp_1"
        assert await keeper.find("resp_1", "someone-else") is None
        with pytest.raises(ServiceUnavailable):  # deleting needs the store: nothing changes meanwhile
            await keeper.delete("resp_2", "anonymous")
        assert await keeper.find("resp_2", None) is not None
        for _ in range(200):
            if keeper.health()["held"] == 0:
                break
            await asyncio.sleep(0.05)
        assert keeper.health() == {"held": 0, "reason": None}
        assert await keeper.delete("resp_2", "anonymous")
        await keeper.close()

    asyncio.run(run())
    reopened = ResponseStore(tmp_path)
    assert reopened.get("resp_1") == stored("resp_1") and reopened.was_deleted("resp_2")
    reopened.close()


def test_past_the_held_limit_a_response_is_not_kept(tmp_path):
    async def run() -> None:
        keeper = ResponseKeeper(FaultyStore(ResponseStore(tmp_path), {"outage": [0, 60], "error": "locked"}))
        for i in range(MAX_UNSAVED):
            assert await keeper.keep(stored(f"resp_{i}"))
        assert not await keeper.keep(stored("resp_over"))
        keeper.store = keeper.store._store  # the outage ends
        assert await keeper.find("resp_over", None) is None
        await keeper.close()  # the close writes what is still held

    asyncio.run(run())
    reopened = ResponseStore(tmp_path)
    assert reopened.get(f"resp_{MAX_UNSAVED - 1}") is not None and reopened.get("resp_over") is None
    reopened.close()


# ---------------------------------------------------------------- items
def test_listed_items_have_ids_and_parts_and_parse_as_the_sdk_types():
    items = listed_items([{"role": "developer", "content": "Be brief."},
                          {"role": "user", "content": [{"type": "input_text", "text": "Weather"},
                                                       {"type": "input_text", "text": " in Paris?"}]},
                          {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                           "arguments": "{}"},
                          {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                          {"role": "assistant", "content": "Sunny."}])
    assert [i["id"][:3] for i in items] == ["msg", "msg", "fc_", "fco", "msg"]
    assert len({i["id"] for i in items}) == 5 and all(i["status"] == "completed" for i in items)
    assert items[0]["content"] == [{"type": "input_text", "text": "Be brief."}]
    assert items[4]["content"] == [{"type": "output_text", "text": "Sunny.", "annotations": []}]
    parsed = ITEMS.validate_python(items)
    assert [type(i).__name__ for i in parsed] == ["ResponseInputMessageItem", "ResponseInputMessageItem",
                                                  "ResponseFunctionToolCallItem",
                                                  "ResponseFunctionToolCallOutputItem", "ResponseOutputMessage"]
    assert listed_items("Hi")[0]["content"] == [{"type": "input_text", "text": "Hi"}]


def test_a_continuation_is_the_conversation_sent_whole():
    """previous_response_id's items, read before the new input, give the spec of the same
    conversation sent in one request: the same prompt, so the prefix cache serves the first turn."""
    first = stored(output=[CALL])
    output = {"type": "function_call_output", "call_id": "call_1", "output": json.dumps({"sky": "clear"})}
    earlier = continued_items(first)
    continued = parse_responses_body({"model": "m", "input": [output], "instructions": "Be brief."}, n_ctx=4096,
                                     earlier=earlier)
    whole = parse_responses_body({"model": "m", "input": [{"role": "user", "content": "Weather in Paris?"}, CALL,
                                                          output], "instructions": "Be brief."}, n_ctx=4096)
    assert continued.spec == whole.spec


def test_errors_in_a_continuation_name_the_requests_own_items():
    earlier = continued_items(stored(output=[CALL]))
    # call_1 is answered by an earlier item's call: accepted; call_2 names no call anywhere.
    parse_responses_body({"model": "m", "input": [{"type": "function_call_output", "call_id": "call_1",
                                                   "output": "x"}]}, n_ctx=4096, earlier=earlier)
    with pytest.raises(BadRequest) as err:
        parse_responses_body({"model": "m", "input": [{"role": "user", "content": "more"},
                                                      {"type": "function_call_output", "call_id": "call_2",
                                                       "output": "x"}]}, n_ctx=4096, earlier=earlier)
    assert err.value.param == "input[1].call_id"
    request = parse_responses_body({"model": "m", "input": "more", "previous_response_id": "resp_1"}, n_ctx=4096,
                                   earlier=earlier)
    assert request.previous_response_id == "resp_1" and request.echo["previous_response_id"] == "resp_1"
    assert request.store is None
