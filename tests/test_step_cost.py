"""The step-cost model the latency target plans with: it must recover a machine's costs from the
steps it saw, stay sensible when every step has one shape, and follow a change of speed."""
from __future__ import annotations

import pytest

from engine.step_cost import StepCostModel


def machine(fixed: float, per_token: float, per_output: float):
    return lambda tokens, outputs: fixed + per_token * tokens + per_output * outputs


def test_recovers_the_costs_of_varied_steps():
    cost = machine(0.010, 0.004, 0.006)
    model = StepCostModel()
    assert model.estimate() is None
    shapes = [(rows, rows) for rows in (1, 4, 8, 16, 24)] + [(rows + prompt, rows + 1) for rows in (2, 8)
                                                            for prompt in (32, 128, 240)]
    for _ in range(6):
        for tokens, outputs in shapes:
            model.record(tokens, outputs, cost(tokens, outputs))
    fit = model.estimate()
    assert fit.per_token_s == pytest.approx(0.004, rel=0.1)
    assert fit.per_output_s == pytest.approx(0.006, rel=0.1)
    assert fit.seconds(12, 12) == pytest.approx(cost(12, 12), rel=0.05)
    assert fit.seconds(200, 3) == pytest.approx(cost(200, 3), rel=0.05)


def test_one_shape_only_still_predicts_that_shape_and_its_neighbours():
    cost = machine(0.020, 0.005, 0.005)
    model = StepCostModel()
    for _ in range(100):
        model.record(16, 16, cost(16, 16))
    fit = model.estimate()
    assert fit.seconds(16, 16) == pytest.approx(cost(16, 16), rel=0.02)
    assert min(fit) > 0  # no negative cost however degenerate the data
    assert fit.seconds(20, 20) > fit.seconds(16, 16) > fit.seconds(8, 8)


def test_follows_a_change_of_speed_within_a_few_dozen_steps():
    fast, slow = machine(0.01, 0.004, 0.004), machine(0.02, 0.008, 0.008)
    model = StepCostModel()
    for i in range(128):
        rows = 1 + i % 16
        model.record(rows, rows, fast(rows, rows))
    for i in range(40):  # a neighbour takes a core
        rows = 1 + i % 16
        model.record(rows, rows, slow(rows, rows))
    assert model.estimate().seconds(8, 8) == pytest.approx(slow(8, 8), rel=0.25)


def test_steps_at_another_thread_count_and_hiccups_do_not_distort_the_fit():
    cost = machine(0.010, 0.004, 0.004)
    model = StepCostModel()
    for i in range(120):
        rows = 1 + i % 16
        if i % 10 == 0:
            model.record(rows, rows, 10 * cost(rows, rows), threads=2)  # the governor's probe, beside a neighbour
        elif i % 17 == 0:
            model.record(rows, rows, cost(rows, rows) + 0.5, threads=1)  # a hiccup
        else:
            model.record(rows, rows, cost(rows, rows), threads=1)
    model.expect_threads(1)
    assert model.estimate().seconds(8, 8) == pytest.approx(cost(8, 8), rel=0.1)
    assert model.estimate(threads=2).seconds(8, 8) == pytest.approx(10 * cost(8, 8), rel=0.1)


def test_refits_after_a_few_steps_or_at_once_when_a_step_misses_its_prediction():
    cost = machine(0.010, 0.004, 0.004)
    model = StepCostModel()
    for i in range(64):
        rows = 1 + i % 16
        model.record(rows, rows, cost(rows, rows))
    fit = model.estimate()
    model.record(8, 8, cost(8, 8))  # predicted well: the fit stands (a refit costs most of a millisecond)
    assert model.estimate() is fit
    model.record(8, 8, 3 * cost(8, 8))  # far off: refit before the next prediction
    assert model.estimate() is not fit
    fit = model.estimate()
    for _ in range(8):
        model.record(8, 8, fit.seconds(8, 8))
    assert model.estimate() is not fit  # refit within eight steps however well they were predicted


def test_learns_the_jump_of_a_second_output_row_from_one_stream_with_and_without_drafts():
    def cost(tokens, outputs):  # a matrix-vector projection for one row, a matrix product for more
        return 0.020 + 0.001 * tokens + 0.004 * outputs + (0.018 if outputs > 1 else 0.0)
    model = StepCostModel()
    for i in range(96):
        k = (0, 0, 1, 4, 0, 8)[i % 6]  # drafted rows, each with logits
        model.record(1 + k, 1 + k, cost(1 + k, 1 + k))
    fit = model.estimate()
    assert fit.multi_output_s == pytest.approx(0.018, rel=0.15)
    assert fit.seconds(1, 1) == pytest.approx(cost(1, 1), rel=0.05)
    assert fit.seconds(2, 2) == pytest.approx(cost(2, 2), rel=0.05)
    assert fit.seconds(9, 9) == pytest.approx(cost(9, 9), rel=0.05)


def test_no_jump_is_guessed_from_steps_that_all_have_one_output_row():
    model = StepCostModel()
    for _ in range(40):
        model.record(1, 1, 0.03)
    assert model.estimate().multi_output_s < 1e-6


def test_a_stream_that_stopped_drafting_keeps_the_jump_it_measured():
    def cost(tokens, outputs):
        return 0.020 + 0.001 * tokens + 0.004 * outputs + (0.018 if outputs > 1 else 0.0)
    model = StepCostModel()
    for i in range(60):
        k = (0, 1, 0, 4)[i % 4]
        model.record(1 + k, 1 + k, cost(1 + k, 1 + k))
    learned = model.estimate().multi_output_s
    assert learned > 0.01
    for _ in range(200):  # the draft steps leave the window
        model.record(1, 1, cost(1, 1))
    assert model.estimate().multi_output_s == pytest.approx(learned, rel=0.1)
    assert StepCostModel().estimate() is None
