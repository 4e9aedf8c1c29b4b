"""Benchmarks: every polyonnx figure has its baseline measured in the same run, so the
number to quote is a ratio. Run: python -m pytest perf --benchmark-only. A case's
benchmarks (polyonnx, onnxruntime, numpy; per thread count) run next to each other
(:func:`side_by_side`).

Unless given on the command line, a benchmark runs at least 3 rounds for about 0.5 s
(pytest-benchmark's defaults are 5 rounds, 1 s): the default suite stays under ten minutes.
``--quick`` keeps a subset that runs in about 1.5 minutes: every kernel family, ResNet-50 and
small models, each with its baselines (``QUICK_CASES``). ``POLYONNX_BENCH_FULL=1`` adds the
slow cases; ``python perf/report.py --run`` runs the suite and prints one table of ratios;
``polyonnx bench`` runs it into a history for ``polyonnx dashboard``.

Saved runs record, beside pytest-benchmark's machine_info, polyonnx's and LLVM's versions,
the compile target and its FMA peak (``machine_info["polyonnx"]``), and the suite
(``"suite"``: quick, default or full)."""

from __future__ import annotations

import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

QUICK_DEFAULTS = {
    "--benchmark-min-rounds": ("benchmark_min_rounds", 3),
    "--benchmark-max-time": ("benchmark_max_time", "0.5"),
}
QUICK_CASES = {
    # test_kernels: every family (square, odd-edged, GEMV and batched MatMul; stem, 3x3,
    # 1x1, strided and depthwise Conv; elementwise chain, Softmax, LayerNorm)
    "matmul-256", "matmul-1024", "matmul-127x255x63", "matmul-1x4096x4096",
    "attention-12x128x64x128", "conv-7x7s2-3to64-224", "conv-3x3-64to64-56",
    "conv-1x1-64to256-56", "conv-3x3s2-128to128-56", "dwconv-3x3-32-112",
    "eltwise-chain-64x1024", "softmax-512x1024", "layernorm-512x768",
    # test_models: ResNet-50 and the small models (the other CNNs take 5 to 20 s each to
    # compile)
    "resnet50", "squeezenet", "mlp", "mm_bias_relu",
}  # fmt: skip
QUICK_FILES = {"test_mlp.py", "test_schedule_tutorial.py"}
"""Kept whole by --quick: they are small."""


def pytest_addoption(parser):
    parser.addoption(
        "--quick", action="store_true", help="polyonnx: only the quick suite (QUICK_CASES)"
    )


def case_id(item) -> str | None:
    """The case of a parametrised test, from its id: ``matmul-256`` of ``matmul-256-1t``."""
    callspec = getattr(item, "callspec", None)
    return re.sub(r"-\d+t$", "", callspec.id) if callspec else None


def pytest_collection_modifyitems(config, items):
    items[:] = side_by_side(items)
    if not config.getoption("--quick"):
        return
    kept, dropped = [], []
    for item in items:
        quick = item.path.name in QUICK_FILES or case_id(item) in QUICK_CASES
        (kept if quick else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def side_by_side(items):
    """The benchmarks of one case and thread count (polyonnx, onnxruntime, numpy) next to
    each other, in their file's order, not every case's polyonnx first: seconds apart, not
    minutes, so a slow phase of the VM hits both sides of a ratio. Two runs of the full
    suite with polyonnx first measured onnxruntime's MatMul 1024^3 at 27.1 and 33.4 ms and
    our Softmax at 0.96 and 1.40 of it."""
    groups: dict[tuple, list] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        key = (item.path, callspec.id) if callspec else (item.path, item.nodeid)
        groups.setdefault(key, []).append(item)
    return [item for group in groups.values() for item in group]


def suite(config) -> str:
    if config.getoption("--quick"):
        return "quick"
    return "full" if os.environ.get("POLYONNX_BENCH_FULL") == "1" else "default"


def pytest_benchmark_update_machine_info(config, machine_info):
    from polyonnx.bench.machine import polyonnx_info

    machine_info["polyonnx"] = polyonnx_info()


def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json["suite"] = suite(config)


def pytest_configure(config):
    """Quicker pytest-benchmark defaults (the plugin reads its options after this hook)."""
    given = [str(arg) for arg in config.invocation_params.args]
    for flag, (dest, value) in QUICK_DEFAULTS.items():
        if not any(arg.startswith(flag) for arg in given):
            setattr(config.option, dest, value)


@pytest.fixture(autouse=True)
def quiet_start():
    """Every benchmark starts once the last one's idle threads stopped spinning
    (polyonnx/quiet.py): onnxruntime's spin for ~60 ms after a 2-thread run, and
    numpy's 2-thread MatMul, which comes right after it, ran 2048^3 slower than on 1."""
    from polyonnx.quiet import wait_until_quiet

    wait_until_quiet()


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


@pytest.fixture
def paired():
    """``paired(benchmark, ours, baselines, threads)``: time polyonnx's call and its
    baselines' (name -> call) turn about in rounds (polyonnx/bench/paired.py) and record
    the per-round ratios' median and quartiles in ``extra_info["paired"]``.

    onnxruntime keeps its defaults, spinning threads included, though a spinning
    session in the process has been measured to slow polyonnx's 2-thread runs (light
    ShuffleNet 5.5 -> 11.7 ms): the paired figure errs against polyonnx, not for it."""
    from polyonnx.bench.paired import paired_ratios

    def measure(benchmark, ours, baselines, threads: int) -> None:
        found = paired_ratios(ours, baselines, threads)
        benchmark.extra_info["paired"] = {name: p.as_dict() for name, p in found.items()}

    return measure
