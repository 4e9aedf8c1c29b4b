"""The per-kernel profiler: profiling builds (polyonnx/emit/module.py), the records of
CompiledModel and InferenceSession (polyonnx/runtime/), and ``polyonnx profile``."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.cli import main
from polyonnx.emit.module import CLOCK_GETTIME, PROFILE_GLOBAL
from polyonnx.errors import PolyonnxError
from polyonnx.runtime.compiled import count_points, multiply_adds
from tests.helpers import fast, make_model, value_info

M, K, N = 16, 24, 40
KERNELS = [("mm", "MatMul"), ("add", "Add"), ("relu", "Relu")]


def _mlp_layer(batch: int | str = M) -> onnx.ModelProto:
    """y = Relu(x[batch, K] @ w[K, N] + b[N]), one kernel per node: the product and the
    sum are graph outputs too, so the Add is not the MatMul's epilogue and the Relu is not
    inlined into the Add."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b"], ["add"], name="add"),
        helper.make_node("Relu", ["add"], ["y"], name="relu"),
    ]
    constants = {
        "w": rng.standard_normal((K, N)).astype(np.float32),
        "b": rng.standard_normal(N).astype(np.float32),
    }
    inputs = [value_info("x", np.float32, [batch, K])]
    outputs = [
        value_info("y", np.float32, [batch, N]),
        value_info("mm", np.float32, [batch, N]),
        value_info("add", np.float32, [batch, N]),
    ]
    model = make_model(nodes, inputs, outputs, constants)
    assert model.ir_version == 10
    return model


def _feed(rows: int = M, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((rows, K)).astype(np.float32)}


# ---- records ----------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
def test_one_record_per_kernel_with_positive_times_and_unchanged_outputs(threads):
    plain = polyonnx.InferenceSession(_mlp_layer(), threads=threads)
    profiled = polyonnx.InferenceSession(_mlp_layer(), threads=threads, profile=True)
    for seed in range(5):
        feed = _feed(seed=seed)
        np.testing.assert_array_equal(profiled.run(None, feed)[0], plain.run(None, feed)[0])
    records = profiled.kernel_profile()
    assert [(r.kernel, r.op_type) for r in records] == KERNELS
    assert all(r.seconds > 0 and r.calls == 5 for r in records)
    assert sum(r.share for r in records) == pytest.approx(1.0)
    assert all(0 < r.share < 1 for r in records)


def test_reset_zeroes_times_and_counts():
    session = polyonnx.InferenceSession(_mlp_layer(), threads=1, profile=True)
    session.run(None, _feed())
    session.reset_profile()
    assert all(r.seconds == 0 and r.calls == 0 and r.share == 0 for r in session.kernel_profile())
    session.run(None, _feed())
    session.run(None, _feed())
    assert [r.calls for r in session.kernel_profile()] == [2, 2, 2]


def test_contraction_records_count_multiply_adds_and_gflops():
    session = polyonnx.InferenceSession(_mlp_layer(), threads=1, profile=True)
    session.run(None, _feed())
    mm, add, relu = session.kernel_profile()
    assert mm.multiply_adds == M * K * N
    assert mm.gflops == pytest.approx(2 * M * K * N / mm.seconds / 1e9)
    assert add.multiply_adds == relu.multiply_adds == 0
    assert add.gflops is None and relu.gflops is None


def test_a_batch_run_in_blocks_keeps_one_profile():
    session = polyonnx.InferenceSession(_mlp_layer("batch"), threads=1, profile=True)
    small, large = _feed(rows=2), _feed(rows=32)
    for feed in (small, large, large):
        session.run(None, feed)
    assert [r.calls for r in session.kernel_profile()] == [66, 66, 66]  # one call per row
    assert session.kernel_profile(small) == session.kernel_profile()
    assert session.kernel_profile(small)[0].multiply_adds == K * N  # one row's
    session.reset_profile()
    assert all(r.calls == 0 for feed in (small, large) for r in session.kernel_profile(feed))


def test_scripted_program_profiles_too():
    program = polyonnx.load(_mlp_layer())
    program.schedule("relu")  # a scripted (here unchanged) schedule next to default ones
    session = polyonnx.InferenceSession(program, threads=1, profile=True)
    y = session.run(None, _feed())[0]
    want = polyonnx.InferenceSession(_mlp_layer(), threads=1).run(None, _feed())[0]
    np.testing.assert_array_equal(y, want)
    assert [(r.kernel, r.calls) for r in session.kernel_profile()] == [
        ("mm", 1),
        ("add", 1),
        ("relu", 1),
    ]


def test_default_build_has_no_timers_and_refuses_profile_questions():
    session = polyonnx.InferenceSession(_mlp_layer(), threads=1)
    compiled = session.compiled_for(_feed())
    assert PROFILE_GLOBAL not in compiled.jit.source
    assert CLOCK_GETTIME not in compiled.jit.source
    with pytest.raises(PolyonnxError, match="profile=True"):
        session.kernel_profile()
    with pytest.raises(PolyonnxError, match="profile=True"):
        session.reset_profile()
    with pytest.raises(PolyonnxError, match="profile=True"):
        compiled.kernel_profile()


def test_profiling_build_times_every_call_site():
    session = polyonnx.InferenceSession(_mlp_layer(), threads=1, profile=True)
    source = session.compiled_for(_feed()).jit.source.replace('"', "")  # llvmlite quotes
    assert f"@{PROFILE_GLOBAL} = global [{2 * len(KERNELS)} x i64] zeroinitializer" in source
    assert source.count("call i64 @polyonnx_now_ns()") == len(KERNELS) + 1


def test_dynamic_model_before_any_run_is_a_clear_error():
    session = polyonnx.InferenceSession(_mlp_layer("batch"), profile=True)
    with pytest.raises(PolyonnxError, match="run the session first"):
        session.kernel_profile()


# ---- counting multiply-adds ---------------------------------------------------------------


def _brute_count(ranges: dict[str, int], keep) -> int:
    grids = np.meshgrid(*(np.arange(n) for n in ranges.values()), indexing="ij")
    points = dict(zip(ranges, grids, strict=True))
    return int(np.count_nonzero(keep(points)))


@fast(25)
@given(
    out=st.integers(1, 12),
    kernel=st.integers(1, 5),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 2),
    pad=st.integers(0, 3),
    size=st.integers(1, 20),
    channels=st.integers(1, 4),
)
def test_count_points_of_padded_conv_domains_is_exact(
    out, kernel, stride, dilation, pad, size, channels
):
    tap = f"{stride}*o + {dilation}*k - {pad}"
    domain = (
        f"{{ S[c, o, k] : 0 <= c < {channels} and 0 <= o < {out} and 0 <= k < {kernel} "
        f"and 0 <= {tap} < {size} }}"
    )

    def inside(p):
        x = stride * p["o"] + dilation * p["k"] - pad
        return (x >= 0) & (x < size)

    want = _brute_count({"c": channels, "o": out, "k": kernel}, inside)
    assert count_points(domain) == want


def test_count_points_of_unions_triangles_and_strides():
    assert count_points("{ S[i, j] : 0 <= i < 10 and 0 <= j <= i }") == 55
    assert count_points("{ S[i] : 0 <= i < 10 or 5 <= i < 30 }") == 30
    assert count_points("{ S[i, j] : 0 <= i < 10 and 0 <= j < 3 and i mod 2 = 0 }") == 15
    assert count_points("{ S[i, j] : 0 <= i < 0 and 0 <= j < 5 }") == 0


def test_multiply_adds_of_a_padded_conv_excludes_the_padding():
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 5, 5])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 5, 5])
    w = np.ones((3, 2, 3, 3), np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    program = polyonnx.load(make_model([conv], [x], [y], {"w": w}))
    # taps per output pixel along one axis: 2 at the borders, 3 inside
    per_axis = 2 + 3 * 3 + 2
    assert multiply_adds(program.kernels["conv"]) == 3 * 2 * per_axis * per_axis


# ---- polyonnx profile ---------------------------------------------------------------------


@pytest.fixture()
def model_path(tmp_path):
    """y = Relu(x[64, 256]) @ w[256, 256] + b, then * 2: kernels that run in an order
    that is not the order of their times (the MatMul, with the Add fused into it as its
    epilogue, is by far the slowest; the sum is an output too, so the Mul stays apart)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "two"], ["y"], name="mul"),
    ]
    constants = {
        "w": rng.standard_normal((256, 256)).astype(np.float32),
        "b": rng.standard_normal(256).astype(np.float32),
        "two": np.float32(2),
    }
    inputs = [value_info("x", np.float32, [64, 256])]
    outputs = [value_info("y", np.float32, [64, 256]), value_info("s", np.float32, [64, 256])]
    model = make_model(nodes, inputs, outputs, constants)
    path = tmp_path / "layer.onnx"
    onnx.save(model, path)
    return str(path)


def _table_rows(out: str) -> dict[str, list[str]]:
    """Kernel name → the cells of its table row (rich's or the plain one)."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.replace("│", "|").split("|") if c.strip()]
        if len(cells) == 1:
            cells = line.split()
        if len(cells) >= 5 and cells[0].isdigit():
            rows[cells[1]] = cells
    return rows


def test_cli_prints_kernels_slowest_first_with_gflops(model_path, capsys):
    pytest.importorskip("rich")
    assert main(["profile", model_path, "--threads", "1", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "threads  1, 3 runs after 1 warm-up" in out
    for column in ("kernel", "op", "ms/run", "% model", "GFLOP/s"):
        assert column in out
    rows = _table_rows(out)
    assert set(rows) == {"mm", "mul", "relu"}
    ms = [float(cells[3]) for cells in sorted(rows.values(), key=lambda c: int(c[0]))]
    assert ms == sorted(ms, reverse=True)
    assert rows["mm"][0] == "1"  # the last but one kernel to run
    assert rows["mm"][2] == "MatMul" and float(rows["mm"][5]) > 0
    assert len(rows["relu"]) == 5  # no GFLOP/s for an elementwise kernel
    assert sum(float(cells[4]) for cells in rows.values()) == pytest.approx(100, abs=0.2)


def test_cli_top_and_plain_table_without_rich(model_path, capsys, monkeypatch):
    for name in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["profile", model_path, "--threads", "1", "--runs", "2", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "┃" not in out and "│" not in out
    assert any(line.split()[:2] == ["#", "kernel"] for line in out.splitlines())
    assert list(_table_rows(out)) == ["mm"]
    assert "... 2 more kernels" in out


def test_cli_rejects_zero_runs(model_path, capsys):
    assert main(["profile", model_path, "--runs", "0"]) == 2
    assert "--runs" in capsys.readouterr().err
