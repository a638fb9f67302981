"""The TTFT floor the mixed-priority benchmark reports: the wait for the uninterruptible tail."""
import pytest

from bench.abort_floor import UninterruptibleTail


def test_wait_quantile_counts_only_arrivals_inside_the_tail():
    tail = UninterruptibleTail(step_ms=200.0, tail_ms=100.0)  # half of every step
    assert tail.share == 0.5
    # P(wait > w) = share * (1 - w / tail) = 0.05  ->  w = tail * (1 - 0.05 / share)
    assert tail.wait_ms(0.95) == pytest.approx(90.0)
    assert tail.wait_ms(0.5) == pytest.approx(0.0)  # half the arrivals never meet the tail


def test_a_tail_rarer_than_the_quantile_costs_nothing_and_no_tail_no_wait():
    assert UninterruptibleTail(step_ms=400.0, tail_ms=10.0).wait_ms(0.95) == 0.0
    assert UninterruptibleTail(step_ms=400.0, tail_ms=0.0).wait_ms(0.95) == 0.0
    assert UninterruptibleTail(step_ms=0.0, tail_ms=0.0).share == 0.0


def test_a_tail_filling_the_whole_step_gives_its_quantile():
    assert UninterruptibleTail(step_ms=100.0, tail_ms=100.0).wait_ms(0.95) == pytest.approx(95.0)


def test_split_cost_is_the_extra_time_of_two_half_steps():
    assert UninterruptibleTail(step_ms=200.0, tail_ms=100.0, halves_ms=222.0).split_cost == pytest.approx(0.11)
    assert UninterruptibleTail(step_ms=200.0, tail_ms=100.0).split_cost is None  # not measured
