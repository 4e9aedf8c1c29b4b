"""Benchmarks: every polyonnx figure has its baseline measured in the same run, so the
number to quote is a ratio. Run: python -m pytest perf --benchmark-only.

Unless given on the command line, a benchmark runs at least 3 rounds for about 0.5 s
(pytest-benchmark's defaults are 5 rounds, 1 s): the quick suite stays under ten minutes.
``POLYONNX_BENCH_FULL=1`` adds the slow cases; ``python perf/report.py --run`` runs the
suite and prints one table of ratios."""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

QUICK_DEFAULTS = {
    "--benchmark-min-rounds": ("benchmark_min_rounds", 3),
    "--benchmark-max-time": ("benchmark_max_time", "0.5"),
}


def pytest_configure(config):
    """Quicker pytest-benchmark defaults (the plugin reads its options after this hook)."""
    given = [str(arg) for arg in config.invocation_params.args]
    for flag, (dest, value) in QUICK_DEFAULTS.items():
        if not any(arg.startswith(flag) for arg in given):
            setattr(config.option, dest, value)


@pytest.fixture(scope="session")
def ort_session():
    """``ort_session(model, threads)``: an onnxruntime CPU session (model: a path or a
    ModelProto) with that many intra-op threads."""
    ort = pytest.importorskip("onnxruntime")

    def make(model, threads: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3  # old models list unused initializers: one warning each
        source = str(model) if isinstance(model, str | pathlib.Path) else model.SerializeToString()
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])

    return make
