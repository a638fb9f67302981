"""The cluster's pieces that need no Ray: what crosses Ray pickles, routing keys, stats sums,
and `cobatch serve` without --replicas never importing ray."""
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from engine import EngineClosedError, FinishReason, GenerationResult, InvalidParameterError, PromptTooLongError
from engine import REFUSALS, QueueFullError, Request, RequestError, RequestMetrics, SamplingParams
from engine import EngineStats, TierStats
from engine.kv_cache import KvCacheStats
from engine.outputs import TokenLogprob
from server.cluster.messages import Accepted, EngineCall, Rejected, route_key
from server.cluster.replica_stats import ReplicaCounters, ReplicaSnapshot, sum_stats

ROOT = Path(__file__).resolve().parent.parent


def _stats(running: int, hits: int, reuse_share: float = 0.4) -> EngineStats:
    kv = KvCacheStats(blocks_total=128, blocks_used=running, blocks_cached=3, blocks_free=125 - running,
                      block_size=16, prefix_lookups=10, prefix_hits=4, prefix_hit_tokens=hits, evictions=1,
                      reuse_share=reuse_share, idle_drops=0)
    tiers = {"interactive": TierStats(0, running, 5, 0, 0, 4), "batch": TierStats(2, 0, 1, 2, 1, 1)}
    return EngineStats(running=running, waiting={"interactive": 0, "batch": 2}, kv_cells_used=running * 20,
                       kv_cells_total=2048, kv=kv, tokens_prefilled=100, tokens_forced=0, suspensions=2, preemptions=1, steps=50,
                       steps_interrupted=0, tiers=tiers)


def test_everything_that_crosses_ray_pickles():
    metrics = RequestMetrics(prompt_tokens=7, tokens_generated=2, queue_time_ms=1.0, ttft_ms=2.0,
                             generation_time_ms=3.0, latency_ms=4.0, tokens_per_second=5.0, cached_tokens=3)
    result = GenerationResult("r1", '{"a": 1}', (5, 6), FinishReason.STOP, metrics, structured_data={"a": 1},
                              logprobs=(TokenLogprob(5, -0.1, ((5, -0.1), (9, -2.0))),))
    snapshot = ReplicaSnapshot("abc", 12, 1 << 20, _stats(1, 32), ReplicaCounters(accepted=3, cached_tokens=32))
    request = Request([2, 818, 5279], max_tokens=4, json_schema={"type": "object"}, request_id="r1",
                      sampling=SamplingParams(temperature=0.5, logit_bias={7: -100}), priority="interactive")
    call = EngineCall.of(request)
    assert call.prompt == route_key([2, 818, 5279]) and call.request is request
    for value in (result, snapshot, call, Accepted("abc", 7), Rejected("QueueFullError", "full")):
        assert pickle.loads(pickle.dumps(value)) == value
    assert pickle.loads(pickle.dumps(result)).finish_reason is FinishReason.STOP


def test_rejections_come_back_as_the_engines_own_errors():
    named = pickle.loads(pickle.dumps(Rejected.of(InvalidParameterError("bad top_p", field="top_p")))).error()
    assert isinstance(named, InvalidParameterError) and named.field == "top_p"
    for exc in (InvalidParameterError("bad top_p"), PromptTooLongError("too long"), QueueFullError("full"),
                EngineClosedError("closing")):
        again = pickle.loads(pickle.dumps(Rejected.of(exc))).error()
        assert type(again) is type(exc) and str(again) == str(exc)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_every_refusal_crosses_ray_as_itself(name):
    """The cluster sends the one list of refusals (engine.REFUSALS): each round-trips."""
    cls = REFUSALS[name]
    assert issubclass(cls, RequestError)
    rejected = pickle.loads(pickle.dumps(Rejected.of(cls(f"refused: {name}"))))
    assert rejected.kind == name
    again = rejected.error()
    assert type(again) is cls and str(again) == f"refused: {name}"


def test_a_refusal_subclass_crosses_as_the_listed_class_it_derives_from():
    class TooFull(QueueFullError):
        pass

    again = Rejected.of(TooFull("full")).error()
    assert type(again) is QueueFullError and str(again) == "full"


def test_route_keys_are_never_empty_and_one_character_per_token():
    assert route_key("hello") == "hello"
    assert route_key("") == "\x00"  # the router divides by the key's length
    assert route_key([]) == "\x00"
    key = route_key([2, 818, 262143])
    assert len(key) == 3 and key.startswith(route_key([2, 818]))
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in key)  # no surrogates
    assert route_key([-1, 2]) == "\x00" + route_key([2])  # invalid ids (the engine refuses them) don't crash routing


def test_cluster_stats_are_the_field_wise_sum_of_the_replicas():
    total = sum_stats([_stats(1, 32, reuse_share=0.2), _stats(3, 64, reuse_share=0.6)])
    assert total.kv.reuse_share == pytest.approx(0.4)  # a share: the mean, not the sum
    assert total.running == 4 and total.kv_cells_used == 80 and total.kv_cells_total == 4096
    assert total.waiting == {"interactive": 0, "batch": 4} and total.steps == 100
    assert total.kv.prefix_hit_tokens == 96 and total.kv.blocks_total == 256 and total.kv.block_size == 16
    assert total.tiers["interactive"].running == 4 and total.tiers["batch"].preemptions == 2
    with pytest.raises(ValueError):
        sum_stats([])


def test_single_process_serve_never_imports_ray():
    code = (
        "import sys\n"
        "from server import cli\n"
        "from server.app import create_app\n"
        "import server.cluster, bench.cli\n"
        "options = cli._parser().parse_args(['serve', '--threads', '1'])\n"
        "cli.engine_options_from(options)\n"
        "create_app(lambda: None)\n"
        "try:\n    cli.main(['serve', '--replicas', '0'])\n"  # refused before anything loads
        "except SystemExit as e:\n    assert e.code == 2\n"
    )
    done = subprocess.run([sys.executable, "-c", code + "print('ray' in sys.modules)"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().endswith("False"), done.stderr


def test_the_ingress_gets_every_server_setting_the_single_process_server_gets():
    pytest.importorskip("ray.serve")
    from server.cluster.deploy import _ingress_settings

    settings = _ingress_settings({"max_running": 8}, 2, 5.0, "m", None, None, ("sk-1",), True, "batch", ("sk-admin",))
    assert settings.api_keys == ("sk-1",) and settings.admin_api_keys == ("sk-admin",)
    assert settings.default_tier == "batch" and settings.protect_metrics and settings.model_id == "m"
