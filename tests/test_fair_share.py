"""Fair share within a tier (engine/fair_share.py) on the real core and policy over the fake
backend: arbitrary arrivals and weights (hypothesis), and the rule's visible effects.

The bound the property test checks, and why it holds: every admission of a tenant's sequence
happens when its counter is the least of the backlogged ones (or it is the only one waiting),
and a joining tenant is lifted to that least counter, never above. So after the last moment a
backlogged tenant's counter was the least, it grows only through the sequences it had running
then: at most max_running of them, each charged at most one request's tokens (prompt plus
max_tokens, a recompute after preemption included, since that needs a new admission). A swap
(a tenant below its weighted share of the slots taking one) admits out of counter order, but only
up to that share, from a tenant that keeps at least its own: the swapping tenant gains, per unit
of weight, no faster than the others but for the requests charged at its swaps. A counter
falls only by what a request was charged ahead and never computed; here every answer runs to its
max_tokens, so that is at most its last token (sampled, never fed back). Hence, between two
backlogged tenants, at any step boundary,

    |service_a / w_a - service_b / w_b| <= max_running * (R_max + 1) / w_min

where R_max is the most tokens one request computes: one request's worth for the slot just
given, and as much again for each other slot the leading tenant may hold. docs/tenants.md states
the general bound, for answers that stop early.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Priority
from engine.sequence import SequenceState
from tests.fake_backend import FakeCore, FakeModel, expected_tokens

BATCH = Priority.BATCH


class Core(FakeCore):
    """The core over the fake backend, with requests made by tenant, weight and lengths."""

    def __init__(self, **overrides) -> None:
        super().__init__(**{"n_ctx": 4096, "step_token_budget": 512, **overrides})
        self.n = 0

    def request(self, tenant: str, weight: float, prompt_len: int, max_tokens: int, priority: str = "batch"):
        self.n += 1
        tokens = [0] + [2 + (self.n * 7 + k) % 50 for k in range(prompt_len - 1)]
        return self.add(f"{tenant}-{self.n}", tokens, max_tokens, priority, tenant=tenant, weight=weight,
                        ignore_eos=True)

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def fair(self):
        return self.core.scheduler.policy.fair

    def live(self) -> int:
        return len(self.scheduler.running) + self.scheduler.n_waiting


arrival = st.tuples(
    st.integers(0, 40),  # the step it arrives before
    st.integers(0, 2),  # tenant
    st.integers(1, 24),  # prompt tokens
    st.integers(1, 24),  # max_tokens
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(arrival, min_size=1, max_size=60),
       weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=3, max_size=3),
       max_running=st.integers(1, 5))
def test_backlogged_tenants_service_stays_within_the_bound_and_no_slot_idles(arrivals, weights, max_running):
    c = Core(max_running=max_running)
    r_max = max(p + m for _, _, p, m in arrivals)
    bound = max_running * (r_max + 1) / min(weights) + 1e-9
    by_step: dict[int, list] = {}
    for step, tenant, p, m in arrivals:
        by_step.setdefault(step, []).append((f"t{tenant}", weights[tenant], p, m))
    step = 0
    while step <= 40 or c.core.has_work():
        for tenant, weight, p, m in by_step.get(step, []):
            c.request(tenant, weight, p, m)
        live = c.live()
        ran = c.core.step()
        # Work-conserving: every slot that a waiting request could take was given (KV and the
        # step budget are ample here, so nothing else can hold one back).
        assert len(c.rows() if ran else ()) == min(max_running, live)
        backlogged = c.fair.backlogged(BATCH)
        counters = [c.fair.service[BATCH].get(t, 0.0) for t in backlogged]
        if len(counters) > 1:
            assert max(counters) - min(counters) <= bound, (backlogged, counters, bound)
        step += 1
        assert step < 5000
    # Every token computed was charged to its tenant: nothing lost, nothing counted twice.
    assert c.scheduler.n_waiting == 0


def test_a_light_tenant_takes_a_slot_at_once_from_the_tenant_above_its_share_and_waits_without():
    admitted_after = {}
    for fair in (True, False):
        c = Core(max_running=4, fair_share=fair)
        heavy = [c.request("heavy", 1.0, 8, 6) for _ in range(40)]
        c.core.step()
        light = c.request("light", 1.0, 8, 6)
        steps = 0
        while light.admitted_at is None:
            c.core.step()
            steps += 1
        admitted_after[fair] = steps
        if fair:
            # heavy held all 4 slots, twice its share of 2: one of its sequences was suspended
            # (keeping its KV), none preempted, and it resumes to the same answer.
            victims = [s for s in heavy if s.suspensions]
            assert len(victims) == 1 and victims[0].state is SequenceState.SUSPENDED
            while c.core.has_work():
                c.core.step()
            assert sum(s.preemptions for s in heavy) == 0
            assert list(victims[0].handle.result(0).token_ids) == expected_tokens(victims[0].tokens[:8], 6)
    # Fair share: the very next step, without waiting for a slot to free; FIFO: the slot after
    # all 40 of the heavy tenant's.
    assert admitted_after[True] == 1
    assert admitted_after[False] >= 50


def test_a_tenant_at_its_share_of_slots_waits_for_a_free_one_and_nobody_swaps_back():
    c = Core(max_running=4)
    for _ in range(2):
        c.request("a", 1.0, 8, 6)
        c.request("b", 1.0, 8, 6)
    c.core.step()
    late = [c.request("a", 1.0, 8, 6), c.request("b", 1.0, 8, 6)]  # each already holds its 2 of 4
    for _ in range(4):
        c.core.step()
        assert all(s.admitted_at is None for s in late)
    assert c.scheduler.tiers[BATCH].suspensions == 0
    # By weight: at 3:1, "b" is due one slot of 4, and holds one, so its next request waits.
    c = Core(max_running=4)
    for _ in range(3):
        c.request("a", 3.0, 8, 6)
    first_b = c.request("b", 1.0, 8, 6)
    c.core.step()
    second_b = c.request("b", 1.0, 8, 6)
    c.core.step()
    assert first_b.admitted_at is not None and second_b.admitted_at is None
    assert c.scheduler.tiers[BATCH].suspensions == 0


def test_no_slot_is_swapped_where_the_newcomer_has_no_kv_room():
    # Four sequences of 56 + 8 tokens fill the 256 cells: a light tenant's request has a slot's
    # claim but no room, so nobody is suspended for it; it runs when a heavy answer ends.
    c = Core(max_running=4, n_ctx=256, block_size=16)
    for _ in range(8):
        c.request("heavy", 1.0, 56, 8)
    c.core.step()
    light = c.request("light", 1.0, 8, 4)
    c.core.step()
    assert light.admitted_at is None and c.scheduler.tiers[BATCH].suspensions == 0
    while light.admitted_at is None:
        c.core.step()
    assert c.scheduler.tiers[BATCH].suspensions == 0 and c.scheduler.tiers[BATCH].preemptions == 0


def test_one_tenant_never_swaps_with_itself():
    c = Core(max_running=3)
    for _ in range(12):
        c.request("only", 1.0, 8, 5)
    while c.core.has_work():
        c.core.step()
    assert c.scheduler.tiers[BATCH].suspensions == 0


def test_weights_share_the_slots_while_both_tenants_stay_backlogged():
    c = Core(max_running=8)
    served = {"a": 0, "b": 0}
    for _ in range(60):
        c.request("a", 3.0, 4, 8)
        c.request("b", 1.0, 4, 8)
    for _ in range(40):  # both stay backlogged all along: 60 requests each, 8 slots
        c.core.step()
        for row in c.runner.current:
            served[row.request_id.split("-")[0]] += row.length
        assert c.fair.backlogged(BATCH).keys() == {"a", "b"}
    share = served["a"] / (served["a"] + served["b"])
    assert abs(share - 0.75) < 0.05, served


def test_a_returning_tenant_is_lifted_to_the_least_backlogged_counter_and_banks_no_idle_time():
    c = Core(max_running=2)
    for _ in range(20):
        c.request("a", 1.0, 4, 8)
    for _ in range(30):
        c.core.step()
    a_service = c.fair.service[BATCH]["a"]
    assert a_service > 50
    late = c.request("b", 1.0, 4, 8)  # b was never seen: its counter starts at a's, not at zero
    assert c.fair.service[BATCH]["b"] == a_service
    for _ in range(9):  # a slot frees within a request's 9 steps, and b takes it
        c.core.step()
    assert late.admitted_at is not None
    # Alternation, not a burst of b: a's and b's counters never drift apart by more than the bound.
    for _ in range(30):
        c.core.step()
        backlogged = c.fair.backlogged(BATCH)
        if len(backlogged) == 2:
            counters = [c.fair.service[BATCH][t] for t in backlogged]
            assert max(counters) - min(counters) <= 2 * 12


def test_a_victim_comes_from_the_tenant_with_most_weighted_service():
    c = Core(max_running=4, batch_min_share=0.25)
    for _ in range(3):
        c.request("greedy", 1.0, 8, 40)
    c.request("modest", 1.0, 8, 40)
    for _ in range(3):
        c.core.step()
    # Even: "greedy" has three sequences running, "modest" one, so "greedy" has been served more.
    assert c.fair.service[BATCH]["greedy"] > c.fair.service[BATCH]["modest"]
    chat = c.request("someone", 1.0, 4, 4, priority="interactive")
    c.core.step()
    assert chat.admitted_at is not None
    suspended = [s for s in c.scheduler.waiting[BATCH]]
    assert [s.request.tenant for s in suspended] == ["greedy"]


def test_the_first_token_lane_takes_a_free_slot_only_for_a_tenant_not_ahead_of_those_waiting():
    import time as _time

    from engine.outputs import append_token
    from tests.fake_backend import expected_tokens

    c = Core(max_running=2)
    for _ in range(2):
        c.request("heavy", 1.0, 4, 3, priority="interactive")
    c.core.step()
    # Lifted to heavy's counter; with a weight worth less than one of the two slots, it cannot
    # take one of heavy's by a swap, and waits.
    waiting = c.request("light", 0.1, 4, 3, priority="interactive")
    c.core.step()
    c.core.step()  # heavy's two finish: two free slots, light still queued (admission comes next step)
    assert c.scheduler.waiting[Priority.INTERACTIVE] and len(c.scheduler.running) == 0

    def lane_sequence(tenant: str, request_id: str):
        tokens = [0, 5, 6, 7]
        seq = c.intake.sequence(tokens, dict(max_tokens=3, request_id=request_id, priority="interactive",
                                              temperature=0.0, tenant=tenant, ignore_eos=True))
        append_token(seq, expected_tokens(tokens, 1)[0], FakeModel.eog_tokens, c.core.n_ctx)
        seq.lane_gave_first_token(_time.perf_counter())
        return seq

    ahead = lane_sequence("heavy", "heavy-lane")
    c.core.adopt(ahead, bytes(ahead.n_prompt), None)
    # heavy has been served more than light, who waits: its lane request queues behind light.
    assert ahead not in c.scheduler.running and list(c.scheduler.waiting[Priority.INTERACTIVE]) == [waiting, ahead]
    newcomer = lane_sequence("newcomer", "new-lane")
    c.core.adopt(newcomer, bytes(newcomer.n_prompt), None)
    assert newcomer in c.scheduler.running  # never served: not ahead of anyone
    while c.core.has_work():
        c.core.step()
    assert list(ahead.handle.result(0).token_ids) == expected_tokens([0, 5, 6, 7], 3)


def test_fair_share_off_keeps_no_counters_and_the_queue_order():
    c = Core(fair_share=False)
    assert c.fair is None
    seqs = [c.request("a" if i < 6 else "b", 1.0, 4, 4) for i in range(8)]
    c.core.step()
    assert c.rows() == {s.request_id for s in seqs[:4]}


def test_a_request_weight_must_be_positive():
    import pytest

    from engine import InvalidParameterError, Request

    for bad in (0, -1.0, float("inf"), True, "2"):
        with pytest.raises(InvalidParameterError):
            Request(prompt="x", weight=bad)
    with pytest.raises(InvalidParameterError):
        Request(prompt="x", tenant=3)
    assert Request(prompt="x", tenant="a", weight=2).weight == 2


def test_answers_of_one_length_ending_together_are_not_split_by_prompt_lengths():
    # Slots freed together are given out one by one to the least served tenant. Charged only
    # their prompts ahead, tenants whose prompts differ would split a wave of slots unevenly and
    # keep that split for the whole wave; charged the output they typically run to as well, the
    # split is even to a slot, window after window.
    c = Core(max_running=16, step_token_budget=256)
    lengths = [15, 70, 22, 41, 63, 18, 35, 55, 27, 48]
    in_flight = {"A": [], "B": []}
    keep = {"A": 48, "B": 12}
    made = {"A": 0, "B": 0}
    seen: dict = {}
    shares = []
    n = 0
    for step in range(16 * 24):
        for tenant in "AB":
            in_flight[tenant] = [s for s in in_flight[tenant] if s.state is not SequenceState.FINISHED]
            while len(in_flight[tenant]) < keep[tenant]:
                n += 1
                in_flight[tenant].append(c.request(tenant, 1.0, lengths[n % len(lengths)], 24))
        c.core.step()
        for tenant in "AB":
            for s in in_flight[tenant]:
                made[tenant] += s.n_generated - seen.get(s, 0)
                seen[s] = s.n_generated
        if step % 48 == 47:
            if step > 96:  # past the first waves, while the typical answer is learned
                shares.append(made["B"] / (made["A"] + made["B"]))
            made = {"A": 0, "B": 0}
    assert len(shares) == 6 and all(abs(share - 0.5) <= 0.02 for share in shares), shares


def test_output_charged_ahead_and_never_computed_is_given_back_when_a_request_ends():
    from engine import FinishReason

    c = Core(max_running=2)
    first = c.request("t", 2.0, 8, 20)
    while c.core.has_work():
        c.core.step()
    assert first.n_generated == 20  # "t"'s answers typically run to 20 tokens now
    before = c.fair.service[BATCH]["t"]
    second = c.request("t", 2.0, 8, 20)
    c.core.step()
    # Its prompt and a typical answer are charged at admission, at weight 2.
    assert c.fair.service[BATCH]["t"] == before + (8 + 20) / 2
    c.core.step()
    c.core.step()
    c.core.finish(second, FinishReason.CANCELLED)
    computed = sum(r.length + r.drafted for step in c.runner.decoded for r in step if r.request_id.startswith("t-"))
    assert second.n_generated == 3 and c.fair.service[BATCH]["t"] == computed / 2
    # A cancelled answer's 3 tokens teach nothing: the next admission is charged 20 ahead again.
    third = c.request("t", 2.0, 8, 20)
    at_admission = c.fair.service[BATCH]["t"]
    c.core.step()
    assert third.admitted_at is not None and c.fair.service[BATCH]["t"] == at_admission + (8 + 20) / 2


def test_a_prompt_cancelled_mid_prefill_is_charged_only_the_rows_computed():
    from engine import FinishReason

    c = Core(max_running=2, step_token_budget=32)
    seq = c.request("t", 1.0, 100, 8)  # its prompt takes four steps of 32 rows
    c.core.step()
    computed = seq.n_computed
    assert 0 < computed < 100 and c.fair.service[BATCH]["t"] == 100  # the whole prompt, charged ahead
    c.core.finish(seq, FinishReason.CANCELLED)
    assert computed == sum(r.length for step in c.runner.decoded for r in step)
    assert c.fair.service[BATCH]["t"] == computed
