"""Reading the history: runs, machines, run references, and the pairing of polyonnx with
its baselines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polyonnx.bench.cases import describe, seconds, table_rows
from polyonnx.bench.history import HistoryError, find_run, load_history, read_run
from tests.bench.synthetic import RUNS, known_history, record, run_json, write_run


def test_runs_are_read_oldest_first_with_commit_and_machine(tmp_path):
    paths = known_history(tmp_path)
    runs, skipped = load_history(tmp_path)
    assert not skipped
    assert [run.path for run in runs] == paths
    assert [run.number for run in runs] == list(range(1, RUNS + 1))
    last = runs[-1]
    assert last.commit == "7" * 40 and last.dirty and last.short_commit == "7777777+"
    assert last.path.name.endswith("_uncommited-changes.json")  # pytest-benchmark's spelling
    assert last.machine.node == "bench-box" and last.machine.cpu == "Test CPU 9000"
    assert last.machine.cores == 2
    assert (last.polyonnx_version, last.llvm_version, last.peak) == ("0.1.0", "22.1.0", 115.2)
    assert last.suite == "quick" and last.has_data
    matmul = last.measurements[0]
    assert (matmul.case, matmul.impl, matmul.threads) == ("matmul-256", "polyonnx", 1)
    assert len(matmul.data) == matmul.rounds == 40
    assert matmul.q1 <= matmul.median <= matmul.q3


def test_other_json_files_are_not_runs_and_broken_runs_are_skipped(tmp_path):
    known_history(tmp_path)
    (tmp_path / "report.json").write_text("{}")  # perf/report.py's table, not a run
    site = tmp_path / "dashboard"
    site.mkdir()
    (site / "index.html").write_text("<html></html>")
    broken = tmp_path / "Linux-CPython-3.11-64bit" / "0099_broken.json"
    broken.write_text('{"benchmarks": [')
    runs, skipped = load_history(tmp_path)
    assert len(runs) == RUNS
    assert len(skipped) == 1 and "0099_broken.json" in skipped[0]
    with pytest.raises(HistoryError, match="not a readable pytest-benchmark run"):
        read_run(broken)


def test_run_references(tmp_path):
    paths = known_history(tmp_path, other_machine=True)
    runs, _ = load_history(tmp_path)
    bench_box = runs[0].machine
    assert find_run(runs, "3").path == paths[2]
    assert find_run(runs, "0003").number == 3
    assert find_run(runs, "last").machine.node == "other-box"
    assert find_run(runs, "last", bench_box).path == paths[-2]
    assert find_run(runs, "2222222").commit == "2" * 40  # a commit prefix
    assert find_run(runs, paths[4].name[:6]).path == paths[4]  # a file name prefix
    assert find_run(runs, str(paths[5])).path == paths[5]  # a file
    other = find_run(runs, "9999999")  # a commit of the other machine
    assert other.machine.node == "other-box"
    with pytest.raises(HistoryError, match=r"no run of bench-box .* matches '9999999'"):
        find_run(runs, "9999999", bench_box)
    with pytest.raises(HistoryError, match="no run matches 'nope'"):
        find_run(runs, "nope")


def test_machines_differ_by_node_cpu_and_cores(tmp_path):
    records = [record("matmul-256", "polyonnx", 1, 1, np.ones(5), True)]
    for node, cpu in [("a", "X"), ("a", "Y"), ("b", "X")]:
        write_run(tmp_path, run_json(records, "f" * 40, "2026-01-01T00:00:00", node, cpu))
    runs, _ = load_history(tmp_path)
    assert len({run.machine for run in runs}) == 3


def bench(name: str, group: str, median: float, params=None, **extra) -> dict:
    return {
        "name": name,
        "group": group,
        "params": params,
        "extra_info": extra,
        "stats": {"median": median},
    }


def test_records_without_extra_info_are_read_from_their_names():
    """test_mlp and test_schedule_tutorial record no extra_info."""
    assert describe(bench("test_polyonnx", "mlp-1thread", 1.0)) == ("mlp", "polyonnx", 1, None)
    assert describe(bench("test_onnxruntime", "mlp-1thread", 1.0)) == (
        "mlp", "onnxruntime", 1, None,
    )  # fmt: skip
    tutorial = bench("test_tutorial_schedule[2]", "tutorial", 1.0, {"threads": 2})
    assert describe(tutorial) == ("tutorial/tutorial_schedule", "polyonnx", 2, None)
    kernel = bench("test_numpy[matmul-64-1t]", "matmul-64-1t", 1.0, None, case="matmul-64",
                   impl="numpy", threads=1, flops=524288)  # fmt: skip
    assert describe(kernel) == ("matmul-64", "numpy", 1, 524288)


def test_variants_share_the_baselines_of_their_case():
    rows = table_rows(
        [
            bench("test_tutorial_schedule[2]", "tutorial", 0.7e-3, {"threads": 2}),
            bench("test_default_schedule[2]", "tutorial", 0.5e-3, {"threads": 2}),
            bench("test_onnxruntime[2]", "tutorial", 0.55e-3, {"threads": 2}),
            bench("test_onnxruntime[1]", "tutorial", 0.9e-3, {"threads": 1}),
        ]
    )
    assert [(r.case, r.threads) for r in rows] == [
        ("tutorial/tutorial_schedule", 2),
        ("tutorial/default_schedule", 2),
    ]
    assert all(r.medians["onnxruntime"] == 0.55e-3 for r in rows)


def test_seconds():
    assert [seconds(t) for t in (2.5, 1.5e-3, 320e-6, 12e-9, None)] == [
        "2.5 s", "1.5 ms", "320 us", "12 ns", "-",
    ]  # fmt: skip


def test_a_run_file_is_pytest_benchmark_json(tmp_path):
    path = known_history(tmp_path)[0]
    data = json.loads(path.read_text())
    assert set(data) >= {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert path.parent.name == "Linux-CPython-3.11-64bit" and path.name.startswith("0001_")
