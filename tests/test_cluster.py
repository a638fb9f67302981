"""cobatch on Ray Serve: 2 engine replicas behind the ingress, on this machine, loopback only.

One cluster serves the whole module (starting it costs about 40 s on 2 cores). The replica
kill test changes the cluster for good, and the benchmark test replaces the app: they run last.
"""
import json
import socket
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

import httpx  # noqa: E402
import jsonschema  # noqa: E402

from bench.record import read_trials  # noqa: E402
from bench.schemas import REVIEW_SCHEMA  # noqa: E402
from bench.sse import sse_events  # noqa: E402
from tests.server_fixtures import scrape, wait_until  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.ray]

APP = "cobatch-test"
ENGINE = dict(n_ctx=2048, max_running=8, step_token_budget=128, n_threads=1)
GOLDEN = json.loads((Path(__file__).parent / "golden" / "greedy_b1.json").read_text())
# Words, not a repeated token: the prefix must reach the replica's KV cache as ~300 real tokens.
LONG_PREFIX = " ".join(f"Rule {i}: answer politely and cite section {i * 7 % 31}." for i in range(30))


class Cluster:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.engines = serve.get_deployment_handle("cobatch-engine", app_name=APP)

    def replicas(self) -> dict:
        """{replica id: ReplicaSnapshot}, asked of every live replica now."""
        return {s.replica: s for s in self.engines.broadcast("stats").results(timeout_s=30)}

    def wait_idle(self, timeout: float = 20.0) -> dict:
        def idle():
            snaps = self.replicas()
            return snaps if all(s.engine.running == 0 and s.engine.kv_cells_used == 0
                                and s.engine.kv.blocks_used == 0 for s in snaps.values()) else None
        return wait_until(idle, timeout, "replicas not idle")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from server.cluster.deploy import CODE_ROOT, build_application

    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": CODE_ROOT}},
             _node_ip_address="127.0.0.1")
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # imbalanced_threshold 1: sequential requests follow their prefix; a burst spreads out.
        app = build_application(None, ENGINE, replicas=2, imbalanced_threshold=1, drain_timeout=5.0,
                                stats_interval=0.5, data_dir=tmp_path_factory.mktemp("jobs"))
        serve.run(app, name=APP, route_prefix="/")
        c = Cluster(port)
        wait_until(lambda: httpx.get(f"{c.url}/health", timeout=10).status_code == 200, 180, "cluster not ready")
        yield c
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture
def http(cluster):
    with httpx.Client(base_url=cluster.url, timeout=120) as client:
        yield client
    cluster.wait_idle()


def test_generate_through_the_cluster_gives_the_golden_greedy_tokens(http):
    n = 8
    r = http.post("/generate", json={"prompt": GOLDEN["prompt"], "max_tokens": n, "temperature": 0, "logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [t["id"] for t in body["logprobs"]] == GOLDEN["tokens"][:n]
    assert body["finish_reason"] == "length" and body["metrics"]["prompt_tokens"] == len(GOLDEN["prompt_ids"])


def test_sse_stream_through_the_cluster_matches_the_plain_answer(http):
    request = {"prompt": "List three colours:", "max_tokens": 12, "temperature": 0}
    plain = http.post("/generate", json=request).json()
    with http.stream("POST", "/generate", json={**request, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [(name, json.loads(data)) for name, data in sse_events(response.iter_lines())]
    deltas = [data["text"] for name, data in events if name == "delta"]
    assert len(deltas) >= 2 and events[-1][0] == "done"
    assert "".join(deltas) == events[-1][1]["text"] == plain["text"]


def test_openai_client_and_json_schema_through_the_cluster(cluster, http):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        chat = client.chat.completions.create(
            model="gemma-3-270m-Q4_K_M", messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8, temperature=0)
        assert chat.choices[0].message.content and chat.usage.prompt_tokens > 5
        review = client.chat.completions.create(
            model="gemma-3-270m-Q4_K_M", max_tokens=120, temperature=0,
            messages=[{"role": "user", "content": "Review the Acme kettle as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "review", "schema": REVIEW_SCHEMA}})
        assert review.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(review.choices[0].message.content), REVIEW_SCHEMA)
        # Too long for a replica's context: its engine refuses at submit, and the ingress answers
        # with the same 400 as one process does.
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="gemma-3-270m-Q4_K_M", prompt="x " * 3000, max_tokens=4)
        assert refused.value.code == "context_length_exceeded"
        assert sum(s.counters.rejected for s in cluster.replicas().values()) >= 1
    finally:
        client.close()


def test_requests_sharing_a_long_prefix_land_on_one_replica(cluster, http):
    before = cluster.replicas()
    n = 4
    for i in range(n):
        r = http.post("/generate", json={"prompt": f"{LONG_PREFIX}\nQuestion {i}: what is rule {i}?",
                                         "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
    after = cluster.replicas()
    gained = {rid: after[rid].counters.accepted - before[rid].counters.accepted for rid in after}
    assert sorted(gained.values()) == [0, n], gained
    (chosen,) = [rid for rid, g in gained.items() if g == n]
    hits = after[chosen].engine.kv.prefix_hit_tokens - before[chosen].engine.kv.prefix_hit_tokens
    assert hits >= (n - 1) * 200  # the later requests reused the first one's prefix blocks
    # The same counters, per replica, in Prometheus (the ingress's view may lag by one poll).
    samples = wait_until(lambda: (s := scrape(http)) and s.get(
        ("cobatch_replica_requests_accepted_total", (("replica", chosen),))) == after[chosen].counters.accepted and s,
        10, "per-replica counter not in /metrics")
    assert {dict(labels)["replica"] for (name, labels) in samples if name == "cobatch_replica_running_sequences"} \
        == set(after)
    health = http.get("/health").json()
    assert {r["replica"] for r in health["replicas"]} == set(after)


def test_a_cancelled_stream_frees_its_kv_on_the_replica(cluster, http):
    body = {"prompt": "Tell a very long story about a lighthouse keeper.", "max_tokens": 600, "temperature": 0.8,
            "seed": 1, "stream": True}
    with http.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        deltas = 0
        for name, _ in sse_events(lines):
            deltas += name == "delta"
            if deltas == 3:
                break
        running = sum(s.engine.running for s in cluster.replicas().values())
        assert running == 1  # still generating when the client hangs up
    hung_up = time.monotonic()
    cluster.wait_idle(timeout=15)  # 600 tokens would take far longer on one thread
    assert time.monotonic() - hung_up < 15


def test_a_killed_replica_fails_only_its_requests_and_is_replaced(cluster):
    before = cluster.replicas()
    results: list[tuple[int, dict]] = []

    def ask(i: int) -> None:
        with httpx.Client(base_url=cluster.url, timeout=180) as client:
            r = client.post("/generate", json={"prompt": f"Write a long essay about topic number {i}:",
                                               "max_tokens": 200, "temperature": 0.7, "seed": i})
            results.append((r.status_code, r.json()))

    streams: list[tuple[int, object]] = []

    def stream(i: int) -> None:
        body = {"prompt": f"Write a long essay about topic number {i}:", "max_tokens": 200, "temperature": 0.7,
                "seed": i, "stream": True}
        with httpx.Client(base_url=cluster.url, timeout=180) as client, \
                client.stream("POST", "/generate", json=body) as response:
            if response.status_code != 200:      # refused before the stream began
                streams.append((response.status_code, json.loads(response.read())))
            else:
                streams.append((200, [(name, json.loads(data)) for name, data in sse_events(response.iter_lines())]))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)] + \
        [threading.Thread(target=stream, args=(i,)) for i in range(6, 8)]
    for t in threads:
        t.start()
    busy = wait_until(lambda: (s := cluster.replicas()) and all(x.engine.running > 0 for x in s.values()) and s,
                      60, "the burst did not reach both replicas")
    victim = sorted(busy)[0]
    (actor,) = [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].endswith(f"#cobatch-engine#{victim}")]
    ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    for t in threads:
        t.join(240)
    statuses = sorted(status for status, _ in results)
    # Every request is answered. The killed replica's end in a clear 5xx, unless Ray Serve sent them
    # again to the live replica: once in about ten runs all six came back complete (200).
    assert len(results) == 6 and statuses[0] == 200, statuses
    for status, body in results:
        if status == 500:  # a clear error naming the cause, not a hang or a dropped connection
            assert body["error"]["code"] == "generation_failed" and "replica" in body["error"]["message"]
        elif status == 503:  # sent to the replica as it died: refused at submit, never started
            assert body["error"]["code"] == "engine_closed" and "replica" in body["error"]["message"]
        else:
            assert status == 200 and body["finish_reason"] in ("length", "stop")
    # A stream ends once, with its text sent exactly once: done with the deltas' text, or an error.
    assert len(streams) == 2
    for status, events in streams:
        if status != 200:   # refused as the replica died, as the plain requests above
            assert (status, events["error"]["code"]) in ((503, "engine_closed"), (500, "generation_failed")), events
            assert "replica" in events["error"]["message"]
            continue
        names = [name for name, _ in events]
        assert names and names[-1] in ("done", "error") and names.count("done") + names.count("error") == 1, names
        if names[-1] == "done":
            assert "".join(d["text"] for n, d in events if n == "delta") == events[-1][1]["text"]
    # Serve starts a new replica in its place; service resumes on both.
    replaced = wait_until(lambda: (s := cluster.replicas()) and len(s) == 2 and victim not in s and s, 180,
                          "the killed replica was not replaced")
    assert set(replaced) - set(before)
    with httpx.Client(base_url=cluster.url, timeout=120) as client:
        for i in range(2):
            r = client.post("/generate", json={"prompt": f"Name a fruit ({i}):", "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text


def test_a_prompt_list_through_the_cluster_gets_a_choice_each(http):
    model = http.get("/v1/models").json()["data"][0]["id"]
    r = http.post("/v1/completions", json={"model": model, "prompt": ["One, two,", "Red, green,"], "n": 2,
                                            "max_tokens": 3, "temperature": 0.8, "seed": 1})
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]


def test_a_batch_job_at_the_ingress_spreads_over_the_replicas(cluster, http):
    openai = pytest.importorskip("openai")
    import io

    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    before = {r: s.engine.tiers["batch"].finished for r, s in cluster.replicas().items()}
    lines = [{"custom_id": f"j{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": model, "prompt": f"Item {i} of the list is", "max_tokens": 6, "temperature": 0}}
             for i in range(24)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("jobs.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    batch = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b,
                       300, "the job did not finish")
    assert batch.status == "completed" and batch.request_counts.completed == 24
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in out) == sorted(f"j{i}" for i in range(24))
    after = {r: s.engine.tiers["batch"].finished for r, s in cluster.replicas().items()}
    assert all(after[r] > before.get(r, 0) for r in after)  # both replicas ran some of it


@pytest.mark.slow
def test_cluster_benchmark_runs_in_quick_mode_and_stores_its_run(cluster, tmp_path, capsys):
    from bench.cli import main
    from server.cluster.deploy import remove_app

    remove_app(APP)  # the benchmark deploys its own apps on this Ray instance
    assert main(["cluster", "--quick", "--port", str(cluster.port), "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("|") > 10 and "prefix" in out and "round-robin" in out and "power-of-two" in out
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["benchmark"] == "cluster" and manifest["command"].startswith("cobatch bench cluster")
    trials = read_trials(folder)
    assert {t["routing"] for t in trials} == {"prefix", "round-robin", "power-of-two"}
    for t in trials:
        assert t["requests"] == sum(t["replica_requests"].values()) > 0
        assert 0 <= t["cached_tokens"] <= t["prompt_tokens"] and t["ttft_ms"]
