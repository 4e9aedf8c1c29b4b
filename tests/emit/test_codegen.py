"""Code generation follows the schedule: SIMD where the schedule marks it, correct tails,
vector accumulators for reductions, per-lane accesses for strided data."""

from __future__ import annotations

import re
from types import MappingProxyType

import numpy as np
import pytest

from polyonnx.emit.codegen import INTERLEAVE, ROLLED_STEPS
from polyonnx.frontend.graph import Graph, Node, Value
from polyonnx.krnl.lower import lower
from polyonnx.runtime.compiled import compile_program, default_schedules
from polyonnx.schedule.pseudo_c import pseudo_c
from polyonnx.schedule.tree import LoopNest, sequence_tree
from polyonnx.target import host_target

LANES = host_target().lanes()
"""float32 lanes of the host's vectors: 16 with AVX-512, 8 with AVX2."""


def _compile(nodes, inputs, outputs, constants=None):
    graph = Graph(
        "g", tuple(inputs), tuple(outputs), tuple(nodes),
        MappingProxyType({}), MappingProxyType(constants or {}), 17,
    )  # fmt: skip
    program = lower(graph)
    return compile_program(program, default_schedules(program))


def _kernel_ir(compiled, index: int) -> str:
    lines = compiled.jit.source.splitlines()
    start = next(
        i for i, ln in enumerate(lines) if ln.startswith("define") and f'@"k{index}_' in ln
    )
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return "\n".join(lines[start : end + 1])


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 100])
def test_elementwise_is_simd_with_tail(n):
    compiled = _compile(
        [Node("add", "Add", ("a", "b"), ("y",), opset=17)],
        [Value("a", (3, n), "float32"), Value("b", (n,), "float32")],
        [Value("y", (3, n), "float32")],
    )
    ir_text = _kernel_ir(compiled, 0)
    if n >= 4:
        assert f"<{LANES} x float>" in ir_text  # explicit SIMD in the generated IR
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((3, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = compiled.run({"a": a, "b": b})["y"]
    np.testing.assert_array_equal(out, a + b)


def test_row_reduction_uses_a_vector_accumulator():
    compiled = _compile(
        [Node("r", "ReduceMax", ("x",), ("y",), {"axes": (1,), "keepdims": 0}, opset=13)],
        [Value("x", (5, 37), "float32")],
        [Value("y", (5,), "float32")],
    )
    ir_text = _kernel_ir(compiled, 0)
    assert re.search(rf"phi\s+<{LANES} x float>", ir_text) and "shufflevector" in ir_text
    x = np.random.default_rng(1).standard_normal((5, 37)).astype(np.float32)
    x[2, 30] = 50.0  # the max sits in the scalar tail of the row
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], x.max(axis=1))


WIDE = LANES * INTERLEAVE


@pytest.mark.parametrize("n", [3, LANES + 1, WIDE - 1, WIDE, WIDE + LANES + 3, 3 * WIDE + 5])
def test_contiguous_loops_step_several_vectors_then_one(n):
    """A row of n: steps of INTERLEAVE vectors, then of one, then the tail; a reduction
    folds its wide accumulator into the one-vector loop's. The max sits in each part."""
    compiled = _compile(
        [
            Node("e", "Exp", ("x",), ("t",), opset=17),
            Node("r", "ReduceMax", ("t",), ("y",), {"axes": (1,), "keepdims": 0}, opset=13),
        ],
        [Value("x", (4, n), "float32")],
        [Value("y", (4,), "float32")],
    )
    assert (f"<{WIDE} x float>" in _kernel_ir(compiled, 1)) == (n >= WIDE)
    x = np.random.default_rng(n).standard_normal((4, n)).astype(np.float32)
    for row, col in enumerate((0, min(WIDE, n - 1), n - 1, n // 2)):
        x[row, col] = 3.0
    expected = np.exp(x.astype(np.float64)).max(axis=1)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=2e-7)


@pytest.mark.parametrize("steps", [2, ROLLED_STEPS, 2 * ROLLED_STEPS])
def test_long_loops_of_wide_steps_are_kept_rolled(steps):
    """A Softmax row of ``steps`` wide steps: from ROLLED_STEPS of them, its loops of wide
    steps carry a distinct loop ID asking LLVM not to unroll them (the module parses and
    runs with it)."""
    n = steps * WIDE
    compiled = _compile(
        [Node("s", "Softmax", ("x",), ("y",), {"axis": -1}, opset=13)],
        [Value("x", (3, n), "float32")],
        [Value("y", (3, n), "float32")],
    )
    source = compiled.jit.source
    marked = re.findall(r"br label %\S+, !llvm\.loop (!\d+)", _kernel_ir(compiled, 0))
    assert (len(marked) >= 3) == (steps >= ROLLED_STEPS)  # max, exp, sum, scale passes
    for loop_id in marked:
        node = re.search(rf"^{loop_id} = distinct !{{ {loop_id}, (!\d+) }}", source, re.M)
        assert node and f'{node[1]} = !{{ !"llvm.loop.unroll.disable" }}' in source
    x = np.random.default_rng(steps).standard_normal((3, n)).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-5, atol=1e-7)


def test_matmul_default_is_the_gemm_ukernel():
    compiled = _compile(
        [Node("mm", "MatMul", ("a", "b"), ("y",), opset=17)],
        [Value("a", (7, 9), "float32"), Value("b", (9, 35), "float32")],
        [Value("y", (7, 35), "float32")],
    )
    text = pseudo_c(compiled.schedules[0], dict(compiled.program.buffers))
    # all 7 rows in one register tile with AVX-512's 32 registers; AVX2 has room for 6, and
    # takes 2 tiles of 4 (8 rows computed) rather than 2 of 6 (12)
    mr = 7 if LANES >= 16 else 4
    assert f"#pragma ukernel_mr{mr}_nr{2 * LANES}_" in text
    assert "for (int k_g = 0; k_g <= 8; k_g++)" in text
    rng = np.random.default_rng(2)
    a, b = (
        rng.standard_normal((7, 9)).astype(np.float32),
        rng.standard_normal((9, 35)).astype(np.float32),
    )
    np.testing.assert_allclose(compiled.run({"a": a, "b": b})["y"], a @ b, rtol=1e-5, atol=1e-5)


def test_strided_reads_are_gathered_per_lane():
    # Gemm with transB reads B[j, k]; a schedule that puts j in SIMD lanes reads B with a
    # stride of K elements per lane (the default would vectorise k, the dot product)
    graph = Graph(
        "g",
        (Value("a", (3, 5), "float32"), Value("b", (21, 5), "float32")),
        (Value("y", (3, 21), "float32"),),
        (Node("g", "Gemm", ("a", "b"), ("y",), {"transB": 1}, opset=17),),
        MappingProxyType({}),
        MappingProxyType({}),
        17,
    )
    program = lower(graph)
    kernel = program.kernels[0]
    nests = [LoopNest(("i", "j"), vectorize=True), LoopNest(("i", "k", "j"), vectorize=True)]
    compiled = compile_program(program, [sequence_tree(kernel, nests)])
    assert f"insertelement <{LANES} x float>" in _kernel_ir(compiled, 0)
    rng = np.random.default_rng(3)
    a, b = (
        rng.standard_normal((3, 5)).astype(np.float32),
        rng.standard_normal((21, 5)).astype(np.float32),
    )
    np.testing.assert_allclose(compiled.run({"a": a, "b": b})["y"], a @ b.T, rtol=1e-5, atol=1e-6)


def test_bool_and_int_outputs():
    compiled = _compile(
        [
            Node("lt", "Less", ("a", "b"), ("m",), opset=17),
            Node("w", "Where", ("m", "a", "b"), ("y",), opset=17),
            Node("c", "Cast", ("y",), ("z",), {"to": 7}, opset=17),
        ],
        [Value("a", (2, 29), "float32"), Value("b", (2, 29), "float32")],
        [Value("m", (2, 29), "bool"), Value("z", (2, 29), "int64")],
    )
    rng = np.random.default_rng(4)
    a, b = (
        (rng.standard_normal((2, 29)) * 10).astype(np.float32),
        (rng.standard_normal((2, 29)) * 10).astype(np.float32),
    )
    out = compiled.run({"a": a, "b": b})
    np.testing.assert_array_equal(out["m"], a < b)
    np.testing.assert_array_equal(out["z"], np.where(a < b, a, b).astype(np.int64))


def test_arena_reuses_memory_of_dead_intermediates():
    nodes = [Node(f"n{i}", "Relu", (f"t{i}",), (f"t{i + 1}",), opset=17) for i in range(6)]
    compiled = _compile(
        nodes, [Value("t0", (64, 64), "float32")], [Value("t6", (64, 64), "float32")]
    )
    layout = compiled.layout
    one = 64 * 64 * 4
    # five intermediates, but at most two are alive at once
    assert layout.arena_bytes <= 2 * one
    assert layout.lower_bound_bytes == 2 * one
    x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({"t0": x})["t6"], np.maximum(x, 0))


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8"])
def test_shifts_by_out_of_range_counts_shift_everything_out(dtype):
    bits = np.iinfo(dtype).bits
    compiled = _compile(
        [
            Node("l", "BitShift", ("x", "s"), ("left",), {"direction": "LEFT"}, opset=18),
            Node("r", "BitShift", ("x", "s"), ("right",), {"direction": "RIGHT"}, opset=18),
        ],
        [Value("x", (6,), dtype), Value("s", (6,), dtype)],
        [Value("left", (6,), dtype), Value("right", (6,), dtype)],
    )
    info = np.iinfo(dtype)
    x = np.array([info.min, -1 if info.min else 200, 4, info.max, 1, 3]).astype(dtype)
    s = np.array([1, bits, bits + 1, bits - 1, 0, 2]).astype(dtype)
    out = compiled.run({"x": x, "s": s})
    wide = x.astype(np.int64)
    in_range = s.astype(np.int64) < bits
    want_left = np.where(in_range, (wide << np.minimum(s, bits - 1)).astype(dtype), 0).astype(dtype)
    sign = np.where(wide < 0, -1, 0)
    want_right = np.where(in_range, wide >> np.minimum(s, bits - 1), sign).astype(dtype)
    np.testing.assert_array_equal(out["left"], want_left)
    np.testing.assert_array_equal(out["right"], want_right)


def test_float_mod_takes_the_divisors_sign_and_int_pow_is_exact():
    compiled = _compile(
        [
            Node("m", "Mod", ("a", "b"), ("mod",), opset=17),
            Node("p", "Pow", ("i", "e"), ("pow",), opset=17),
        ],
        [
            Value("a", (6,), "float32"),
            Value("b", (6,), "float32"),
            Value("i", (5,), "int64"),
            Value("e", (5,), "int64"),
        ],
        [Value("mod", (6,), "float32"), Value("pow", (5,), "int64")],
    )
    a = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0], np.float32)
    b = np.array([2.1, -3.4, 8.0, -2.1, 3.4, 5.0], np.float32)
    i, e = np.array([2, 3, -3, 7, 10], np.int64), np.array([5, 6, 3, 0, 9], np.int64)
    out = compiled.run({"a": a, "b": b, "i": i, "e": e})
    np.testing.assert_allclose(out["mod"], np.mod(a, b), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["pow"], i**e)


def test_double_to_half_cast_links_and_rounds():
    # a direct fptrunc double -> half is a compiler-rt call the JIT cannot resolve
    compiled = _compile(
        [
            Node("c", "Cast", ("x",), ("h",), {"to": 10}, opset=17),
            Node("d", "Cast", ("h",), ("y",), {"to": 11}, opset=17),
        ],
        [Value("x", (7,), "float64")],
        [Value("h", (7,), "float16"), Value("y", (7,), "float64")],
    )
    x = np.array([0.5, 1.5, 65504.0, 1e6, -3.14159, 1e-8, np.nan])
    out = compiled.run({"x": x})
    np.testing.assert_array_equal(out["h"], x.astype(np.float16))
    np.testing.assert_array_equal(out["y"], x.astype(np.float16).astype(np.float64))


def test_identical_kernels_share_one_function():
    """Kernels that differ only in tensor names (repeated blocks) compile once."""
    nodes = [
        Node("r1", "Relu", ("x",), ("a",), opset=17),
        Node("r2", "Relu", ("a",), ("b",), opset=17),
        Node("s", "Sigmoid", ("b",), ("c",), opset=17),
        Node("r3", "Relu", ("c",), ("y",), opset=17),
    ]
    compiled = _compile(nodes, [Value("x", (3, 40), "float32")], [Value("y", (3, 40), "float32")])
    symbols = compiled.symbols
    assert symbols[0] == symbols[1] == symbols[3] != symbols[2]
    assert compiled.jit.source.count('define void @"k') == 2
    x = np.random.default_rng(6).standard_normal((3, 40)).astype(np.float32)
    want = np.maximum(1 / (1 + np.exp(-np.maximum(x, 0))), 0)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-6)


def test_same_op_on_other_shapes_gets_its_own_function():
    nodes = [
        Node("r1", "Relu", ("x",), ("a",), opset=17),
        Node("f", "Flatten", ("a",), ("b",), {"axis": 0}, opset=17),
        Node("r2", "Relu", ("b",), ("y",), opset=17),
    ]
    compiled = _compile(nodes, [Value("x", (3, 40), "float32")], [Value("y", (1, 120), "float32")])
    assert compiled.symbols[0] != compiled.symbols[1]


def test_isl_min_and_max_with_more_than_two_arguments():
    """A tiled, padded conv makes isl bound a loop by min(a, b, c); every argument counts."""
    graph = Graph(
        "g",
        (Value("x", (1, 2, 7, 9), "float32"), Value("w", (3, 2, 3, 3), "float32")),
        (Value("y", (1, 3, 7, 9), "float32"),),
        (Node("k", "Conv", ("x", "w"), ("y",), {"pads": (1, 1, 1, 1)}, opset=17),),
        MappingProxyType({}),
        MappingProxyType({}),
        17,
    )
    program = lower(graph)
    from polyonnx.schedule.schedule import Schedule

    s = Schedule(program.kernels[0], program.buffers)
    s.split("o0", 1)
    s.split("o0_o", 1)
    s.tile("k1", "o0_o_o", sizes=(3, 5))  # the example hypothesis found
    assert "min(4, ((-5 * o0_o_o_o) + 6), " in str(s)
    compiled = compile_program(program, [s.kernel_schedule()])
    rng = np.random.default_rng(7)
    x, w = (
        rng.standard_normal((1, 2, 7, 9)).astype(np.float32),
        rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
    )
    reference = compile_program(program, default_schedules(program)).run({"x": x, "w": w})["y"]
    np.testing.assert_allclose(compiled.run({"x": x, "w": w})["y"], reference, rtol=1e-5, atol=1e-5)
