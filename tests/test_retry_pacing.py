"""The in-flight limit's Retry-After (server/retry_pacing.py through server/quotas.py), with a
crowd of closed-loop clients simulated on a clock the test moves: each honours the wait it is
told, as the `openai` SDK does."""
from __future__ import annotations

import heapq

from server.quotas import Quotas, RateLimited
from server.retry_pacing import MAX_WAIT_S, MIN_WAIT_S, RETRIES_PER_FREED_SLOT
from server.tenants import Limits, Tenant


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(clock: Clock, quotas: Quotas, tenant: Tenant, clients: int, service_s: float, until: float,
             measure_from: float) -> dict[str, float]:
    """Closed-loop clients, each sending again as soon as it is answered, retrying a refusal after
    its retry-after-ms. Counts refusals, completions and slot-seconds used after `measure_from`."""
    events = [(clock.now + i * 1e-3, i, "send", None) for i in range(clients)]  # (time, client, kind, admission)
    heapq.heapify(events)
    refused = finished = 0
    busy_s = 0.0
    waits: list[float] = []
    while events and events[0][0] < until:
        clock.now, client, kind, admission = heapq.heappop(events)
        if kind == "finish":
            admission.finish(10)
            finished += clock.now >= measure_from
            busy_s += max(0.0, clock.now - max(measure_from, clock.now - service_s))
        try:
            held = quotas.admit(tenant, lambda: 5, 10)
        except RateLimited as refusal:
            wait = int(refusal.headers["retry-after-ms"]) / 1000
            assert int(refusal.headers["Retry-After"]) == max(1, -(-int(refusal.headers["retry-after-ms"]) // 1000))
            if clock.now >= measure_from:
                refused += 1
                waits.append(wait)
            heapq.heappush(events, (clock.now + wait, client, "send", None))
            continue
        heapq.heappush(events, (clock.now + service_s, client, "finish", held))
    return {"refused": refused, "finished": finished, "busy_s": busy_s, "max_wait": max(waits, default=0.0),
            "last_wait": waits[-1] if waits else 0.0}


def test_a_crowd_past_its_limit_is_paced_to_a_few_retries_per_freed_slot_and_keeps_its_slots_busy():
    clock, limit, service_s = Clock(), 4, 4.0
    quotas, tenant = Quotas(clock), Tenant("crowd", limits=Limits(max_in_flight=limit))
    seen = simulate(clock, quotas, tenant, clients=96, service_s=service_s, until=400.0, measure_from=100.0)
    per_completion = seen["refused"] / seen["finished"]
    # A fixed 1 s wait would answer 92 refusals a second, 92 per completion here.
    assert RETRIES_PER_FREED_SLOT / 2 <= per_completion <= RETRIES_PER_FREED_SLOT * 2, seen
    assert seen["busy_s"] / (limit * 300.0) >= 0.9, seen  # slots stand free for only a short time
    assert MIN_WAIT_S < seen["max_wait"] <= MAX_WAIT_S


def test_the_wait_comes_back_to_the_minimum_once_the_crowd_has_gone():
    clock = Clock()
    quotas, tenant = Quotas(clock), Tenant("crowd", limits=Limits(max_in_flight=2))
    crowded = simulate(clock, quotas, tenant, clients=50, service_s=3.0, until=200.0, measure_from=150.0)
    assert crowded["last_wait"] > 4 * MIN_WAIT_S, crowded
    clock.now += 10.0  # the crowd has gone; three clients for a limit of two
    calm = simulate(clock, quotas, tenant, clients=3, service_s=3.0, until=clock.now + 300.0,
                    measure_from=clock.now + 200.0)
    assert calm["last_wait"] == MIN_WAIT_S, calm


def test_the_first_refusal_is_told_the_minimum_and_other_tenants_are_paced_apart():
    clock = Clock()
    quotas = Quotas(clock)
    crowd, alone = Tenant("crowd", limits=Limits(max_in_flight=1)), Tenant("alone", limits=Limits(max_in_flight=1))
    simulate(clock, quotas, crowd, clients=40, service_s=5.0, until=120.0, measure_from=0.0)
    quotas.admit(alone, lambda: 1, 1)
    try:
        quotas.admit(alone, lambda: 1, 1)
    except RateLimited as refusal:
        assert refusal.headers["retry-after-ms"] == str(round(MIN_WAIT_S * 1000))
    else:
        raise AssertionError("the second request in flight was let through")
