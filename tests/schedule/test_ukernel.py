"""The ukernel schedule (packed GEMM, schedule/heuristics/ukernel.py + emit/ukernel.py) and epilogue
fusion (krnl/epilogue.py), against numpy on hypothesis shapes: odd sizes, partial row and
column tiles, K blocks, padded/strided/dilated/grouped convs, and fused epilogues."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from polyonnx.emit.module import emit_module
from polyonnx.errors import ScheduleError
from polyonnx.krnl.ops import winograd
from polyonnx.runtime.compiled import lower_model
from polyonnx.runtime.memory import plan_memory
from polyonnx.schedule.gemm import geometry, is_ukernel_mark
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.heuristics.gemm_defaults import default_params, vector_registers
from polyonnx.target import host_target
from tests.helpers import (
    conv2d_reference,
    fast,
    make_model,
    random_array,
    seeds,
    square_conv_model,
    sum_tol,
    value_info,
)

F32 = np.float32
sizes = st.sampled_from((1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 47, 49, 63, 64, 65))


def _matmul_model(a_shape, b_shape, out_shape):
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    return make_model(
        [node],
        [value_info("a", F32, a_shape), value_info("b", F32, b_shape)],
        [value_info("y", F32, out_shape)],
    )


def _default_params(model, lanes: int = 8):
    """The default ukernel parameters of the model's first contraction for ``lanes``
    (8: AVX2's 16 registers; 16: AVX-512's 32)."""
    program = lower_model(model)
    stmt = next(s for k in program.kernels for s in k.statements if s.reduce)
    geo = geometry(stmt, program.buffers)
    return default_params(geo, lanes, vector_registers(lanes))


def _uses_ukernel(model) -> bool:
    program = lower_model(model)
    trees = [default_schedule(k, program.buffers).tree for k in program.kernels]
    return any("ukernel_" in tree for tree in trees)


@fast(25)
@given(m=sizes, k=sizes, n=sizes, seed=seeds)
def test_matmul_odd_sizes(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, (m, k)), random_array(rng, (k, n))
    model = _matmul_model((m, k), (k, n), (m, n))
    got = polyonnx.InferenceSession(model).run(None, {"a": a, "b": b})[0]
    np.testing.assert_allclose(got, a @ b, **sum_tol(4 * k))


def test_odd_matmul_goes_through_the_ukernel_with_partial_tiles():
    # 37 rows = 4 tiles of 8 + 5; 70 columns = 2 tiles of 32 + 6; K = 600 = 512 + 88
    assert _uses_ukernel(_matmul_model((37, 600), (600, 70), (37, 70)))
    rng = np.random.default_rng(0)
    a, b = random_array(rng, (37, 600)), random_array(rng, (600, 70))
    got = polyonnx.InferenceSession(_matmul_model((37, 600), (600, 70), (37, 70))).run(
        None, {"a": a, "b": b}
    )[0]
    np.testing.assert_allclose(got, a @ b, **sum_tol(2400))


@fast(10)
@given(batch=st.sampled_from((1, 3, 12)), m=sizes, k=sizes, n=sizes, seed=seeds)
def test_batched_matmul(batch, m, k, n, seed):
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, (batch, m, k)), random_array(rng, (batch, k, n))
    model = _matmul_model((batch, m, k), (batch, k, n), (batch, m, n))
    got = polyonnx.InferenceSession(model).run(None, {"a": a, "b": b})[0]
    np.testing.assert_allclose(got, a @ b, **sum_tol(4 * k))


@fast(15)
@given(
    c=st.sampled_from((1, 3, 8, 17)),
    m=st.sampled_from((4, 9, 16, 33)),
    hw=st.sampled_from((5, 7, 12, 16)),
    k=st.sampled_from((1, 3, 5)),
    stride=st.sampled_from((1, 2)),
    pad=st.sampled_from((0, 1, 2)),
    dilation=st.sampled_from((1, 2)),
    group=st.sampled_from((1, 2)),
    relu=st.booleans(),
    seed=seeds,
)
def test_conv_with_fused_relu(c, m, hw, k, stride, pad, dilation, group, relu, seed):
    if hw + 2 * pad < dilation * (k - 1) + 1 or c * group > 40 or m % group:
        return
    rng = np.random.default_rng(seed)
    cin = c * group
    x = random_array(rng, (1, cin, hw, hw))
    w = random_array(rng, (m, c, k, k))
    bias = random_array(rng, (m,))
    ref = conv2d_reference(x, w, bias, stride, pad, dilation, group)
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["t" if relu else "y"], name="conv",
            strides=[stride] * 2, pads=[pad] * 4, dilations=[dilation] * 2, group=group,
        )
    ]  # fmt: skip
    if relu:
        nodes.append(helper.make_node("Relu", ["t"], ["y"], name="relu"))
        ref = np.maximum(ref, 0)
    model = make_model(
        nodes, [value_info("x", F32, x.shape)], [value_info("y", F32, ref.shape)],
        {"w": w, "b": bias},
    )  # fmt: skip
    got = polyonnx.InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, **sum_tol(16 * c * k * k))


def _resnet_block(shape=(1, 16, 9, 9)):
    """Conv -> BatchNormalization -> Add(residual) -> Relu: the Conv absorbs the rest."""
    rng = np.random.default_rng(1)
    c = shape[1]
    consts = {
        "w": random_array(rng, (c, c, 3, 3), low=-0.3, high=0.3),
        "scale": random_array(rng, (c,), low=0.5, high=1.5),
        "beta": random_array(rng, (c,)),
        "mean": random_array(rng, (c,)),
        "var": random_array(rng, (c,), low=0.5, high=2.0),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["bn"], name="bn"
        ),
        helper.make_node("Add", ["bn", "x"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    model = make_model(nodes, [value_info("x", F32, shape)], [value_info("y", F32, shape)], consts)
    return model, consts


def test_conv_bn_add_relu_is_one_kernel_and_matches_numpy():
    model, k = _resnet_block()
    program = lower_model(model)
    assert [kernel.name for kernel in program.kernels] == ["conv"]
    assert not {"c", "bn", "s"} & set(program.buffers)
    x = random_array(np.random.default_rng(2), (1, 16, 9, 9))
    conv = conv2d_reference(x, k["w"], np.zeros(16, F32), 1, 1, 1, 1)
    inv = (k["scale"] / np.sqrt(k["var"] + 1e-5))[None, :, None, None]
    want = np.maximum(
        (conv - k["mean"][None, :, None, None]) * inv + k["beta"][None, :, None, None] + x, 0
    )
    got = polyonnx.InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    schedule = default_schedule(program.kernels[0], program.buffers)
    assert "ukernel_" in schedule.tree


def test_an_intermediate_that_is_a_graph_output_is_not_fused_away():
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["t"], name="mm"),
        helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ]
    model = make_model(
        nodes,
        [value_info("a", F32, (20, 30)), value_info("b", F32, (30, 40))],
        [value_info("t", F32, (20, 40)), value_info("y", F32, (20, 40))],
    )
    assert [k.name for k in lower_model(model).kernels] == ["mm", "relu"]
    rng = np.random.default_rng(3)
    a, b = random_array(rng, (20, 30)), random_array(rng, (30, 40))
    t, y = polyonnx.InferenceSession(model).run(None, {"a": a, "b": b})
    np.testing.assert_allclose(t, a @ b, **sum_tol(120))
    np.testing.assert_allclose(y, np.maximum(a @ b, 0), **sum_tol(120))


def test_an_intermediate_with_two_readers_is_not_fused_away():
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["t"], name="mm"),
        helper.make_node("Relu", ["t"], ["r"], name="relu"),
        helper.make_node("Neg", ["t"], ["y"], name="neg"),
    ]
    model = make_model(
        nodes,
        [value_info("a", F32, (20, 30)), value_info("b", F32, (30, 40))],
        [value_info("r", F32, (20, 40)), value_info("y", F32, (20, 40))],
    )
    kernels = lower_model(model).kernels
    assert [k.name for k in kernels] == ["mm", "relu", "neg"]
    rng = np.random.default_rng(4)
    a, b = random_array(rng, (20, 30)), random_array(rng, (30, 40))
    r, y = polyonnx.InferenceSession(model).run(None, {"a": a, "b": b})
    np.testing.assert_allclose(r, np.maximum(a @ b, 0), **sum_tol(120))
    np.testing.assert_allclose(y, -(a @ b), **sum_tol(120))


# ---- the schedule primitive ------------------------------------------------------------


def test_ukernel_step_with_parameters_replays_and_matches():
    model = _matmul_model((45, 70), (70, 50), (45, 50))
    prog = polyonnx.load(model)
    s = prog.schedule("mm")
    s.ukernel(mr=4, nr=16, kc=16, mc=8, nc=32, unroll=3, split="rows", packa=1, packb=1, prefetch=1)
    mark = next(m for marks in s.state.marks.values() for m in marks if is_ukernel_mark(m))
    assert mark == "ukernel_mr4_nr16_kc16_mc8_nc32_unroll3_splitrows_packa1_packb1_prefetch1"
    rng = np.random.default_rng(5)
    a, b = random_array(rng, (45, 70)), random_array(rng, (70, 50))
    got = polyonnx.InferenceSession(prog, threads=2).run(None, {"a": a, "b": b})[0]
    np.testing.assert_allclose(got, a @ b, **sum_tol(280))
    again = polyonnx.load(model)
    again.apply(s.trace)
    assert again.schedule("mm").state.marks == s.state.marks


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"nr": 17}, "multiple of the SIMD width"),
        ({"kc": 0}, "kc=0 must be at least 1"),
        ({"split": "diagonal"}, "split='diagonal'"),
        ({"prefetch": 2}, "prefetch=2 must be 0 or 1"),
        ({"tile": 3}, "unknown parameters"),
        ({"kc": 4096, "nc": 1024, "packb": 1}, "must fit in 3 MB of stack"),
    ],
)
def test_ukernel_step_refuses_bad_parameters(params, reason):
    s = polyonnx.load(_matmul_model((20, 30), (30, 40), (20, 40))).schedule("mm")
    with pytest.raises(ScheduleError, match=reason):
        s.ukernel(**params)
    assert not s.trace


def test_ukernel_step_needs_untransformed_loops():
    s = polyonnx.load(_matmul_model((20, 30), (30, 40), (20, 40))).schedule("mm")
    i, *_ = s.loops
    s.split(i, 4)
    with pytest.raises(ScheduleError, match="already transformed"):
        s.ukernel()


@fast(25)
@given(
    m=sizes, k=sizes, n=sizes,
    mr=st.sampled_from((1, 3, 8)), nr=st.sampled_from((16, 32, 48)),
    kc=st.sampled_from((1, 7, 64)), mc=st.sampled_from((1, 5, 64)),
    nc=st.sampled_from((16, 40, 512)), unroll=st.sampled_from((1, 3, 4)),
    split=st.sampled_from(("none", "rows", "cols")), packa=st.sampled_from((0, 1)),
    packb=st.sampled_from((0, 1)), prefetch=st.sampled_from((0, 1)), seed=seeds,
)  # fmt: skip
def test_any_ukernel_parameters_compute_the_product(
    m, k, n, mr, nr, kc, mc, nc, unroll, split, packa, packb, prefetch, seed
):
    model = _matmul_model((m, k), (k, n), (m, n))
    prog = polyonnx.load(model)
    params = dict(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, unroll=unroll, split=split)
    params.update(packa=packa, packb=packb, prefetch=prefetch)
    try:
        prog.schedule("mm").ukernel(**params)
    except ScheduleError:
        assert n < 16 or m < 2 or k < 2  # too small a product to be one
        return
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, (m, k)), random_array(rng, (k, n))
    got = polyonnx.InferenceSession(prog, threads=2).run(None, {"a": a, "b": b})[0]
    np.testing.assert_allclose(got, a @ b, **sum_tol(4 * k))


@fast(25)
@given(
    c=st.sampled_from((1, 5, 16)), m=st.sampled_from((3, 8, 17)),
    hw=st.sampled_from((1, 5, 7, 9)), k=st.sampled_from((1, 3)),
    stride=st.sampled_from((1, 2)), pad=st.sampled_from((0, 1)),
    nr=st.sampled_from((16, 32)), kc=st.sampled_from((1, 7, 64)),
    nc=st.sampled_from((16, 40, 512)), split=st.sampled_from(("none", "cols")), seed=seeds,
)  # fmt: skip
def test_a_conv_with_b_packed_computes_the_conv(c, m, hw, k, stride, pad, nr, kc, nc, split, seed):
    """Packing copies a 1x1 Conv's whole output plane as one run (emit/packing.py
    ``run_dims``), a padded or strided one row by row: column blocks that start and end
    mid-row, K blocks, and planes shorter than a vector."""
    if hw + 2 * pad < k or (k == 1 and pad):
        return  # no window fits; or border outputs with no products: not one contraction
    rng = np.random.default_rng(seed)
    x, w = random_array(rng, (1, c, hw, hw)), random_array(rng, (m, c, k, k))
    ref = conv2d_reference(x, w, np.zeros(m, F32), stride, pad, 1, 1)
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], name="conv", strides=[stride] * 2, pads=[pad] * 4
    )
    model = make_model(
        [node], [value_info("x", F32, x.shape)], [value_info("y", F32, ref.shape)], {"w": w}
    )
    prog = polyonnx.load(model)
    try:
        prog.schedule("conv").ukernel(mr=4, nr=nr, kc=kc, nc=nc, split=split, packb=1)
    except ScheduleError:
        assert ref[0, 0].size < 16 or c * k * k < 2  # too small a product to be one
        return
    got = polyonnx.InferenceSession(prog, threads=2).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, **sum_tol(4 * c * k * k))


def test_reading_b_in_place_is_refused_for_an_im2col():
    x = helper.make_tensor_value_info("x", 1, (1, 8, 9, 9))
    w = np.ones((16, 8, 3, 3), F32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", strides=[2, 2])
    model = make_model([node], [x], [value_info("y", F32, (1, 16, 4, 4))], {"w": w})
    s = polyonnx.load(model).schedule("conv")
    with pytest.raises(ScheduleError, match="packb=0 needs B contiguous"):
        s.ukernel(packb=0)
    s.ukernel(packb=1)


def test_a_parallel_loop_around_a_threaded_gemm_is_refused():
    model = _matmul_model((8, 64, 96), (8, 96, 80), (8, 64, 80))
    s = polyonnx.load(model).schedule("mm")
    s.ukernel(split="cols")
    with pytest.raises(ScheduleError, match="already runs on threads"):
        s.parallel("b0_g")


def test_packed_a_counts_in_the_stack_budget():
    s = polyonnx.load(_matmul_model((256, 512), (512, 2048), (256, 2048))).schedule("mm")
    with pytest.raises(ScheduleError, match="must fit in 3 MB of stack"):
        s.ukernel(packa=1, mc=2048, kc=512, nc=512)


def test_a_batch_of_small_gemms_runs_its_batch_loop_on_threads():
    model = _matmul_model((12, 128, 64), (12, 64, 128), (12, 128, 128))  # attention's QK^T
    program = lower_model(model)
    tree = default_schedule(program.kernels[0], program.buffers).tree
    assert 'mark: "parallel"' in tree and "splitnone" in tree
    rng = np.random.default_rng(6)
    a, b = random_array(rng, (12, 128, 64)), random_array(rng, (12, 64, 128))
    got = polyonnx.InferenceSession(model, threads=2).run(None, {"a": a, "b": b})[0]
    np.testing.assert_allclose(got, a @ b, **sum_tol(256))


@pytest.mark.parametrize(
    ("model", "in_place"),
    [
        (_matmul_model((64, 256), (256, 3136), (64, 3136)), True),  # B 3.2 MB, 64 rows
        (_matmul_model((256, 64), (64, 3136), (256, 3136)), False),  # B 0.8 MB
        (_matmul_model((1024, 1024), (1024, 1024), (1024, 1024)), False),  # 1024 rows
        (_matmul_model((16, 64), (64, 64), (16, 64)), True),  # too few rows to pack for
        (_matmul_model((68, 68), (68, 196), (68, 196)), True),  # few rows, short K
        (_matmul_model((128, 128), (128, 16384), (128, 16384)), False),  # short, B 8 MB
        (_matmul_model((128, 256), (256, 784), (128, 784)), False),  # K 256
        (_matmul_model((64, 1024), (1024, 1024), (64, 1024)), False),  # B 4 MB: memory
        (_matmul_model((8, 1024), (1024, 1024), (8, 1024)), True),  # too few rows
    ],
)
def test_the_default_reads_b_in_place_where_packing_measured_slower(model, in_place):
    program = lower_model(model)
    tree = default_schedule(program.kernels[0], program.buffers).tree
    assert ("packb0" in tree) == in_place


def _llvm_ir(model) -> str:
    program = lower_model(model)
    schedules = [default_schedule(k, program.buffers) for k in program.kernels]
    layout = plan_memory(program)
    places = {name: (p.slot, p.offset) for name, p in layout.places.items()}
    return str(emit_module(schedules, program.buffers, places, host_target())[0])


@pytest.mark.parametrize(
    ("model", "pass_of_its_own"),
    [
        (_matmul_model((37, 600), (600, 70), (37, 70)), False),  # B read a row at a time
        (square_conv_model(3, 64, 30, 3, stride=2, pad=1), True),  # im2col of a strided Conv
    ],
    ids=["matmul", "strided-conv"],
)
def test_b_read_a_row_at_a_time_is_packed_by_the_first_row_tile(model, pass_of_its_own):
    """A MatMul's B is packed as the block's first row tile computes (no packing loop,
    "pk"); a strided Conv's im2col block is still packed by a pass of its own."""
    blocks = set(re.findall(r'^"?([a-z]+)[.\w]*"?:', _llvm_ir(model), re.M))
    assert {"ic", "jr", "ir", "ku"} <= blocks
    assert ("pk" in blocks) == pass_of_its_own


@pytest.mark.parametrize(
    ("shape", "prefetch"),
    [
        ((1024, 256, 196), (True, True)),  # A 1 MB: a 1x1 Conv's weights, from memory
        ((128, 512, 784), (False, True)),  # A 256 KB: AVX2 prefetches from 128 KB
        ((256, 64, 3136), (False, False)),  # A 64 KB stays in cache
        ((127, 255, 63), (False, False)),
    ],
)
def test_the_default_prefetches_a_large_a_a_row_panel_ahead(shape, prefetch):
    m, k, n = shape
    model = _matmul_model((m, k), (k, n), (m, n))
    program = lower_model(model)
    schedule = default_schedule(program.kernels[0], program.buffers)
    prefetch = prefetch[host_target().lanes() < 16]  # AVX-512, AVX2
    assert ("prefetch1" in schedule.tree) == prefetch
    layout = plan_memory(program)
    places = {name: (p.slot, p.offset) for name, p in layout.places.items()}
    text = str(emit_module([schedule], program.buffers, places, host_target())[0])
    # llvm.prefetch(address, write=0, locality=2 (L2), data=1), in the K loop only
    assert ("i32 0, i32 2, i32 1)" in text) == prefetch


@pytest.mark.parametrize(
    ("model", "prefetch"),
    [
        (square_conv_model(128, 128, 28, 3), 1),  # Winograd: 16 blocks of 64 KB
        (_matmul_model((128, 128), (128, 196), (128, 196)), 0),  # one block of 64 KB
    ],
)
def test_avx2_counts_a_batched_a_whole_for_the_prefetch(model, prefetch):
    """16 GEMMs that each read their own A read 16 of them from memory an inference
    (AVX2_PREFETCH_A_BYTES)."""
    assert _default_params(model).prefetch == prefetch


@pytest.mark.parametrize(
    ("rows", "lanes", "mr"),
    [
        (34, 16, 6),
        (68, 16, 8),
        (1000, 16, 8),
        (12, 16, 6),
        (4, 16, 4),
        (68, 8, 6),
        (4, 8, 4),
        (8, 8, 4),
        (16, 8, 4),  # 18 rows computed as 6s: 1.125 times
        (32, 8, 4),
        (28, 8, 6),  # 30: 1.07 times
        (12, 8, 6),
    ],
)
def test_the_default_register_tile_wastes_few_rows(rows, lanes, mr):
    # AVX-512 (16 lanes, 32 registers) takes 8-row tiles unless 6-row ones waste fewer rows;
    # AVX2 (8 lanes, 16 registers) has room for 6 rows of two accumulators only
    program = lower_model(_matmul_model((rows, 64), (64, 196), (rows, 196)))
    stmt = next(s for s in program.kernels[0].statements if s.reduce)
    geo = geometry(stmt, program.buffers)
    assert default_params(geo, lanes, vector_registers(lanes)).mr == mr


@pytest.mark.parametrize(
    ("columns", "lanes", "nr"),
    [
        (49, 16, 48),  # a 28 x 28 output's Winograd tiles: one whole 48 tile, 1 left
        (48, 16, 48),
        (63, 16, 48),
        (47, 16, 32),
        (64, 16, 32),
        (196, 16, 32),
        (49, 8, 16),  # AVX2: no registers for a 3-vector tile
    ],
)
def test_the_default_register_tile_is_3_vectors_wide_for_3_to_4_vectors_of_columns(
    columns, lanes, nr
):
    program = lower_model(_matmul_model((128, 64), (64, columns), (128, columns)))
    stmt = next(s for s in program.kernels[0].statements if s.reduce)
    geo = geometry(stmt, program.buffers)
    assert default_params(geo, lanes, vector_registers(lanes)).nr == nr


@pytest.mark.parametrize(
    ("shape", "rows"),
    [
        ((8, 1024, 1024), True),  # B 4 MB, from memory, and too few rows to pack it for
        ((13, 1024, 1100), True),  # odd rows and columns
        ((8, 784, 512), False),  # B 1.6 MB
        ((64, 1024, 1024), False),  # packed
    ],
)
def test_the_default_reads_a_big_b_for_few_rows_a_few_whole_rows_at_a_time(shape, rows):
    m, k, n = shape
    model = _matmul_model((m, k), (k, n), (m, n))
    program = lower_model(model)
    tree = default_schedule(program.kernels[0], program.buffers).tree
    assert ("_kc16_" in tree) == rows
    if rows:
        nr = 2 * host_target().lanes()
        assert f"_nc{-(-n // nr) * nr}_" in tree  # whole rows, in NR multiples
        rng = np.random.default_rng(7)
        a, b = random_array(rng, (m, k)), random_array(rng, (k, n))
        got = polyonnx.InferenceSession(model, threads=2).run(None, {"a": a, "b": b})[0]
        np.testing.assert_allclose(got, a @ b, **sum_tol(k))


@pytest.mark.parametrize(
    ("shape", "packa"),
    [
        ((1024, 1024, 1024), True),  # A 4 MB
        ((1000, 1000, 1000), True),
        ((512, 512, 512), False),  # A 1 MB: packing it measured slower
        ((1024, 256, 196), False),
        ((128, 64, 196), False),
    ],
)
def test_the_avx2_default_packs_a_large_a_or_prefetches_it(shape, packa):
    m, k, n = shape
    params = _default_params(_matmul_model((m, k), (k, n), (m, n)))
    assert (params.mr, params.nr, params.mc) == (6, 16, 72)
    assert params.prefetch == (not packa and 4 * m * k >= 128 << 10)  # packed A is in L2
    assert params.unroll == (8 if params.packb else 4)
    assert params.packa == packa
    assert params.nc == (min(-(-n // 16) * 16, 1024) if packa else min(-(-n // 16) * 16, 512))


@pytest.mark.parametrize(
    ("shape", "mr"),
    [
        ((256, 64, 3136), 4),  # packed B, 64 deep: 4-row tiles (AVX2_SHALLOW_K)
        ((200, 100, 3136), 4),  # 200 rows: 34 tiles of 6 against 50 of 4
        ((256, 256, 3136), 6),
        ((64, 64, 3136), 6),  # 64 rows, 64 deep: B read in place keeps 6 rows
    ],
)
def test_a_shallow_avx2_gemm_with_b_packed_takes_four_row_tiles(shape, mr):
    m, k, n = shape
    params = _default_params(_matmul_model((m, k), (k, n), (m, n)))
    assert params.mr == mr
    assert params.packb == (mr == 4 or k >= 256)


@pytest.mark.parametrize(("n", "packa"), [(49, False), (64, False), (128, True), (196, True)])
def test_avx2_packs_a_large_a_only_for_enough_columns(n, packa):
    # A of 8 MB: packed for a wide B, read in place for ResNet-50's 7x7 tail (49 columns)
    params = _default_params(_matmul_model((2048, 1024), (1024, n), (2048, n)))
    assert params.packa == packa


@pytest.mark.parametrize(
    ("c", "hw", "kc"),
    [
        (512, 7, 4608),  # every channel of the window, one block
        (128, 28, 1152),
        (1024, 14, 4608),  # 9216 taps: two blocks
        (256, 56, 2304),
    ],
)
def test_avx2_k_blocks_of_a_conv_read_in_place(c, hw, kc, monkeypatch):
    """Whole windows of every channel, up to 4608 taps (AVX2_PREFETCHED_TAPS_KC), where
    the Conv stays direct (not Winograd's, krnl/ops/winograd.py)."""
    monkeypatch.setattr(winograd, "CHANNEL_PAIRS", 1 << 62)
    monkeypatch.setattr(winograd, "F4_CHANNEL_PAIRS", 1 << 62)
    model = square_conv_model(c, c, hw, 3)
    params = _default_params(model)
    assert (params.packb, params.kc) == (0, kc)
    assert _default_params(model, 16).kc == min(9 * c, 2304)


def test_a_tile_prefetches_every_line_of_its_c_rows_and_residual_rows():
    """Before the K loop, each row of a tile asks for the lines of C and of an epilogue
    operand that its NR columns span, wherever they start in a line: the run's first
    element, every line start within it, and its last element (a 14x14 plane's rows, and a
    numpy array's, start mid-line; the first element of each vector missed the last line)."""
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["t"], name="mm"),
        helper.make_node("Add", ["t", "r"], ["y"], name="residual"),
    ]
    shapes = {"a": (64, 96), "b": (96, 196), "r": (64, 196)}
    model = make_model(
        nodes, [value_info(n, F32, s) for n, s in shapes.items()], [value_info("y", F32, (64, 196))]
    )
    program = lower_model(model)
    (kernel,) = program.kernels
    schedule = default_schedule(kernel, program.buffers)
    nr = 2 * host_target().lanes()
    layout = plan_memory(program)
    places = {name: (p.slot, p.offset) for name, p in layout.places.items()}
    text = str(emit_module([schedule], program.buffers, places, host_target())[0])
    geps = dict(re.findall(r'(%"[\w.]+") = getelementptr float, ptr %"[\w.]+", i64 (-?\d+)', text))
    offsets = {"write": set(), "read": set()}
    for pointer, write in re.findall(
        r'@"llvm.prefetch.p0"\(ptr (%"[\w.]+"), i32 (\d), i32 3', text
    ):
        offsets["write" if write == "1" else "read"].add(int(geps.get(pointer, 0)))
    whole = sorted({*range(0, nr, 16), nr - 1})  # a whole tile's run
    assert set(whole) <= offsets["write"] and set(whole) <= offsets["read"]
    rng = np.random.default_rng(3)
    feeds = {n: random_array(rng, s) for n, s in shapes.items()}
    got = polyonnx.InferenceSession(model).run(None, feeds)[0]
    np.testing.assert_allclose(got, feeds["a"] @ feeds["b"] + feeds["r"], **sum_tol(96))


@pytest.mark.parametrize(
    ("shape", "mc"),
    [
        ((256, 64, 3136), 4),  # ResNet-50's 1x1 Conv 64 -> 256: a row panel at a time
        ((4096, 64, 4096), 4),
        ((128, 512, 784), 72),  # deep enough
        ((64, 64, 3136), 72),  # B read in place
    ],
)
def test_a_shallow_avx2_gemm_sweeps_one_row_panel_at_a_time(shape, mc):
    m, k, n = shape
    params = _default_params(_matmul_model((m, k), (k, n), (m, n)))
    assert params.mc == mc
    assert _default_params(_matmul_model((m, k), (k, n), (m, n)), 16).mc == 64  # AVX-512
