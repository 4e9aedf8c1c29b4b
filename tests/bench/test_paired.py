"""Paired rounds (polyonnx/bench/paired.py) and their column in the report table."""

from __future__ import annotations

import time

import pytest

from polyonnx.bench import paired as paired_module
from polyonnx.bench.cases import table_rows
from polyonnx.bench.paired import paired_ratios
from polyonnx.bench.table import HEADER, cells


def _sleeper(seconds: float):
    return lambda: time.sleep(seconds)


def test_the_ratio_is_taken_round_by_round():
    """A contender twice as slow reads 0.5; the rounds alternate and stay in bounds."""
    found = paired_ratios(_sleeper(0.002), {"slow": _sleeper(0.004)}, budget=0.0)
    assert set(found) == {"slow"}
    slow = found["slow"]
    assert slow.rounds == paired_module.MIN_ROUNDS
    assert 0.35 < slow.q1 <= slow.median <= slow.q3 < 0.7


def test_a_drifting_machine_slows_both_sides_of_a_round(monkeypatch):
    """The machine gets 3x slower half way: a ratio of medians taken in different phases
    would be off by 3x; the paired ratio is the one within each round."""
    clock = {"now": 0.0, "calls": 0}

    def fake_perf_counter():
        return clock["now"]

    def contender(cost):
        def run():
            clock["calls"] += 1
            slow = 3.0 if clock["calls"] > 20 else 1.0
            clock["now"] += cost * slow

        return run

    monkeypatch.setattr(paired_module.time, "perf_counter", fake_perf_counter)
    found = paired_ratios(contender(1.0), {"base": contender(2.0)}, budget=1e9)
    assert found["base"].rounds == paired_module.MAX_ROUNDS
    assert found["base"].median == pytest.approx(0.5)


def test_every_baseline_gets_its_ratio_and_orders_alternate():
    order = []
    ours = lambda: order.append("ours")  # noqa: E731
    found = paired_ratios(
        lambda: (ours(), time.sleep(0.003)),
        {"a": lambda: (order.append("a"), time.sleep(0.001))},
        budget=0.0,
    )
    assert set(found) == {"a"}
    # a first call of ours sizes the batches (one call each here), then the rounds flip
    assert order == ["ours"] + ["ours", "a", "a", "ours"] * 2 + ["ours", "a"]
    assert found["a"].median > 1.5  # ours is the slower one here


def test_the_table_shows_paired_ratios_where_measured():
    def bench(impl, median, paired=None):
        extra = {"case": "matmul-64", "impl": impl, "threads": 1, "flops": 524288}
        if paired:
            extra["paired"] = paired
        return {"name": f"test_{impl}", "group": "g", "extra_info": extra,
                "stats": {"median": median}}  # fmt: skip

    paired = {"onnxruntime": {"median": 0.8, "q1": 0.7, "q3": 0.9, "rounds": 5}}
    (row,) = table_rows([bench("polyonnx", 1e-3, paired), bench("onnxruntime", 2e-3)])
    assert row.paired == {"onnxruntime": 0.8}
    line = dict(zip(HEADER, cells(row, None), strict=True))
    assert (line["ratio ort"], line["paired ort"], line["paired numpy"]) == ("0.50", "0.80", "-")


def test_percent_of_peak_uses_the_peak_measured_beside_the_benchmark():
    """A contraction's benchmark records an FMA loop's rate run right after it (the clock
    of a VM drifts over a run); the table takes its percent of that, else of the run's."""

    def bench(peak=None):
        extra = {"case": "matmul-64", "impl": "polyonnx", "threads": 2, "flops": 10**9}
        if peak:
            extra["peak_gflops_per_core"] = peak
        return {"name": "test_polyonnx", "group": "g", "extra_info": extra,
                "stats": {"median": 1e-2}}  # fmt: skip

    (beside,) = table_rows([bench(peak=62.5)])  # 100 GFLOP/s on 2 cores of 62.5
    (start,) = table_rows([bench()])
    assert dict(zip(HEADER, cells(beside, 100.0), strict=True))["% peak"] == "80%"
    assert dict(zip(HEADER, cells(start, 100.0), strict=True))["% peak"] == "50%"
