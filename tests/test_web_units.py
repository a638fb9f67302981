"""The web page's server side without the model: its static files and what ships them, the routes
it adds (conversations, schema check, engine events), --no-web, and API keys on all of them."""
from __future__ import annotations

import ast
import asyncio
import fnmatch
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from server.app import create_app
from server.cli import _parser
from server.context import ServerSettings
from server.web.events import _events, snapshot
from server.web.page import STATIC, static_files
from tests.fake_backend import fake_engine

ROOT = Path(__file__).resolve().parent.parent
KEYS = {"alice": "sk-alice", "bob": "sk-bob"}


def no_model():
    raise RuntimeError("no model in these tests")


def client(data_dir: Path | None = None, **settings) -> TestClient:
    return TestClient(create_app(no_model, ServerSettings(data_dir=data_dir, **settings)))


def as_(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


# ---- static files ---------------------------------------------------------------------------------

def test_the_page_and_every_file_it_loads_are_served_with_their_types_and_policy():
    with client() as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        assert "default-src 'self'" in page.headers["content-security-policy"]
        loaded = re.findall(r'(?:src|href)="(/web/[^"]+)"', page.text)
        assert "/web/js/main.js" in loaded and "/web/style.css" in loaded
        for path in loaded:
            r = c.get(path)
            assert r.status_code == 200, path
            assert r.headers["content-type"].split(";")[0] in ("text/javascript", "text/css", "image/svg+xml")
        assert c.get("/web/js/missing.js").status_code == 404
        assert c.get("/web/../app.py").status_code == 404


def test_every_module_a_script_imports_is_a_served_file():
    served = set(static_files())
    for script in sorted((STATIC / "js").glob("*.js")):
        for target in re.findall(r'from "(\./[^"]+)"', script.read_text()):
            assert f"/web/js/{target[2:]}" in served, f"{script.name} imports {target}, which is not served"


def test_the_package_data_ships_every_static_file():
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    patterns = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "package_data"))["server.web"]
    files = [p.relative_to(STATIC.parent).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    assert files and all(any(fnmatch.fnmatch(f, pattern) for pattern in patterns) for f in files), files


def test_no_web_leaves_out_the_page_and_its_routes_but_not_the_api(tmp_path):
    assert _parser().parse_args(["serve", "--no-web"]).web is False
    assert _parser().parse_args(["serve"]).web is True
    with client(tmp_path, web=False) as c:
        assert c.get("/").status_code == 404
        assert c.get("/web/js/main.js").status_code == 404
        assert c.get("/v1/web/conversations").status_code == 404
        assert c.post("/v1/web/validate", json={"schema": {}, "instance": 1}).status_code == 404
        assert c.get("/v1/engine/events").status_code == 200  # part of the API: the stream ends, not serving
        assert c.get("/v1/files").status_code == 200


def test_with_keys_the_page_is_open_and_every_data_route_needs_a_key(tmp_path):
    with client(tmp_path, api_keys=tuple(KEYS.values())) as c:
        assert c.get("/").status_code == 200 and c.get("/web/js/api.js").status_code == 200
        for method, path in (("GET", "/v1/web/conversations"), ("POST", "/v1/web/conversations"),
                             ("GET", "/v1/engine/events"), ("POST", "/v1/web/validate"), ("GET", "/v1/models")):
            r = c.request(method, path, json={})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        assert c.get("/v1/web/conversations", headers=as_("alice")).status_code == 200


# ---- conversations --------------------------------------------------------------------------------

def test_conversations_are_created_listed_renamed_updated_and_deleted(tmp_path):
    with client(tmp_path) as c:
        first = c.post("/v1/web/conversations", json={"title": "First", "settings": {"temperature": "0.2"}}).json()
        assert first["messages"] == [] and first["settings"] == {"temperature": "0.2"}
        second = c.post("/v1/web/conversations", json={}).json()
        assert second["title"] == "New conversation"
        turn = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!", "stats": {"ttft_ms": 80.5, "cached_tokens": 0}}]
        updated = c.post(f"/v1/web/conversations/{first['id']}", json={"messages": turn}).json()
        assert updated["messages"] == turn and updated["title"] == "First" and updated["updated_at"] > first["updated_at"]
        listed = c.get("/v1/web/conversations").json()["data"]
        assert [(x["id"], x["message_count"]) for x in listed] == [(first["id"], 2), (second["id"], 0)]  # recent first
        assert c.post(f"/v1/web/conversations/{second['id']}", json={"title": "  Renamed "}).json()["title"] == "Renamed"
        assert c.get(f"/v1/web/conversations/{first['id']}").json()["messages"] == turn
        assert c.delete(f"/v1/web/conversations/{first['id']}").json()["deleted"] is True
        for method in ("GET", "DELETE"):
            r = c.request(method, f"/v1/web/conversations/{first['id']}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"
        assert [x["id"] for x in c.get("/v1/web/conversations").json()["data"]] == [second["id"]]


def test_conversations_survive_a_restart_of_the_app(tmp_path):
    with client(tmp_path) as c:
        made = c.post("/v1/web/conversations", json={"title": "Kept", "messages": [{"role": "user", "content": "x"}]})
    assert (tmp_path / "conversations.sqlite3").exists()
    with client(tmp_path) as c:
        assert c.get(f"/v1/web/conversations/{made.json()['id']}").json()["messages"] == [{"role": "user", "content": "x"}]


def test_each_key_sees_only_its_own_conversations(tmp_path):
    with client(tmp_path, api_keys=tuple(KEYS.values())) as c:
        mine = c.post("/v1/web/conversations", json={"title": "Alice's"}, headers=as_("alice")).json()
        assert c.get("/v1/web/conversations", headers=as_("bob")).json()["data"] == []
        for method in ("GET", "DELETE"):
            assert c.request(method, f"/v1/web/conversations/{mine['id']}", headers=as_("bob")).status_code == 404
        assert c.post(f"/v1/web/conversations/{mine['id']}", json={"title": "Bob's"}, headers=as_("bob")).status_code == 404
        assert c.get(f"/v1/web/conversations/{mine['id']}", headers=as_("alice")).json()["title"] == "Alice's"


@pytest.mark.parametrize("body,param", [
    ({"title": ""}, "title"),
    ({"title": "x" * 201}, "title"),
    ({"title": 3}, "title"),
    ({"colour": "red"}, "colour"),
    ({"messages": {"role": "user"}}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]}, "messages[1].content"),
    ({"messages": [{"role": "user", "content": "a", "name": "x"}]}, "messages[0].name"),
    ({"messages": [{"role": "assistant", "content": "a", "stats": [1]}]}, "messages[0].stats"),
    ({"settings": "hot"}, "settings"),
])
def test_a_bad_conversation_field_is_a_400_naming_it(tmp_path, body, param):
    with client(tmp_path) as c:
        r = c.post("/v1/web/conversations", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert c.get("/v1/web/conversations").json()["data"] == []  # nothing stored


def test_an_update_with_nothing_to_change_is_a_400(tmp_path):
    with client(tmp_path) as c:
        made = c.post("/v1/web/conversations", json={}).json()
        assert c.post(f"/v1/web/conversations/{made['id']}", json={}).status_code == 400


# ---- schema check ---------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}, "required": ["age"]}


def test_the_schema_check_says_valid_or_names_each_problem():
    with client() as c:
        assert c.post("/v1/web/validate", json={"schema": SCHEMA, "instance": {"age": 3}}).json()["valid"] is True
        verdict = c.post("/v1/web/validate", json={"schema": SCHEMA, "instance": {"age": -1}}).json()
        assert verdict["valid"] is False and verdict["errors"][0]["path"] == "/age"
        assert "minimum" in verdict["errors"][0]["message"] or "less than" in verdict["errors"][0]["message"]
        missing = c.post("/v1/web/validate", json={"schema": SCHEMA, "instance": {}}).json()
        assert missing["errors"] == [{"path": "/", "message": "'age' is a required property"}]
        for body, param in (({"schema": {"type": 7}, "instance": 1}, "schema"), ({"schema": SCHEMA}, "instance"),
                            ({"schema": "x", "instance": 1}, "schema"), ({"schema": {}, "instance": 1, "x": 1}, "x")):
            r = c.post("/v1/web/validate", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param


# ---- engine events --------------------------------------------------------------------------------

def test_a_snapshot_lists_only_the_steps_after_the_last_one_sent():
    engine, _ = fake_engine()
    try:
        handle = engine.submit([0, 5, 6, 7], max_tokens=6, priority="interactive")
        handle.result(10)
        stats = engine.stats()
        everything = snapshot(stats, -1)
        assert [s["step"] for s in everything["steps"]] == list(range(1, stats.steps + 1))
        assert everything["tiers"]["interactive"]["tokens_generated"] == 6
        assert everything["tiers"]["interactive"]["prompt_tokens"] == 4
        assert everything["kv"]["blocks_total"] == stats.kv.blocks_total
        assert [s["step"] for s in snapshot(stats, stats.steps - 2)["steps"]] == [stats.steps - 1, stats.steps]
        assert snapshot(stats, stats.steps)["steps"] == []
    finally:
        engine.close()


def test_the_event_stream_sends_snapshots_and_ends_when_the_server_stops_serving():
    engine, _ = fake_engine()
    state = SimpleNamespace(status="ok", engine=engine)
    ctx = SimpleNamespace(state=state)
    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(jobs=None)), scope={})

    async def read() -> list[bytes]:
        events, got = _events(request, ctx), []
        got.append(await events.__anext__())
        engine.submit([0, 9, 9], max_tokens=3).result(10)
        got.append(await events.__anext__())
        state.status = "draining"
        got += [e async for e in events]  # the stream ends by itself
        return got

    try:
        got = asyncio.run(asyncio.wait_for(read(), 10))
    finally:
        engine.close()
    import json
    first, second = (json.loads(e.decode().removeprefix("data: ")) for e in got[:2])
    assert first["status"] == "ok" and second["steps_total"] > first["steps_total"]
    assert [s["step"] for s in second["steps"]] == list(range(first["steps_total"] + 1, second["steps_total"] + 1))
    assert len(got) == 2
