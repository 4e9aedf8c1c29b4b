"""Elementwise chain fusion (polyonnx/krnl/chain.py): fused programs compute what the
unfused ones do, and every precondition has a case that must stay unfused."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from polyonnx.frontend.load import load_graph
from polyonnx.krnl.chain import fuse_elementwise
from polyonnx.krnl.ir import Program
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.runtime.compiled import compile_program, default_schedules
from tests.helpers import MATH_TOL, broadcast_shapes, fast, make_model, random_array, seeds
from tests.helpers import value_info as info

F32 = np.float32


def run(program: Program, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return compile_program(program, default_schedules(program)).run(feed)


def lowered(nodes, inputs: dict[str, tuple[int, ...]], outputs: dict[str, tuple[int, ...]]):
    model = make_model(
        nodes,
        [info(n, F32, s) for n, s in inputs.items()],
        [info(n, F32, s) for n, s in outputs.items()],
    )
    # the bare lowering: the compile pipeline's own rewrites may include this pass
    return lower(load_graph(model, supported_ops=supported_ops()))


def feed_for(inputs: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: random_array(rng, s) for n, s in inputs.items()}


def assert_same(before: Program, after: Program, feed: dict[str, np.ndarray]) -> None:
    want, got = run(before, feed), run(after, feed)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], **MATH_TOL)


CHAIN = [
    helper.make_node("Add", ["x", "b"], ["t0"]),
    helper.make_node("Mul", ["t0", "s"], ["t1"]),
    helper.make_node("Relu", ["t1"], ["t2"]),
    helper.make_node("Sigmoid", ["t2"], ["y"]),
]
CHAIN_INPUTS = {"x": (5, 13), "b": (13,), "s": (5, 1)}


def test_broadcasting_chain_becomes_one_statement():
    program = lowered(CHAIN, CHAIN_INPUTS, {"y": (5, 13)})
    fused = fuse_elementwise(program)
    assert len(fused.kernels) == 1
    (kernel,) = fused.kernels
    assert kernel.op_type == "Add+Mul+Relu+Sigmoid"
    assert len(kernel.statements) == 1
    assert kernel.reads() == {"x", "b", "s"}
    assert not {"t0", "t1", "t2"} & set(fused.buffers)
    assert_same(program, fused, feed_for(CHAIN_INPUTS))


def test_input_program_is_unchanged():
    program = lowered(CHAIN, CHAIN_INPUTS, {"y": (5, 13)})
    kernels, buffers = program.kernels, dict(program.buffers)
    fuse_elementwise(program)
    assert program.kernels == kernels and dict(program.buffers) == buffers


def test_nothing_to_fuse_returns_the_program():
    program = lowered([helper.make_node("Relu", ["x"], ["y"])], {"x": (3,)}, {"y": (3,)})
    assert fuse_elementwise(program) is program


def test_graph_output_is_not_inlined():
    nodes = [helper.make_node("Add", ["x", "b"], ["t0"]), helper.make_node("Relu", ["t0"], ["y"])]
    inputs = {"x": (4, 7), "b": (7,)}
    program = lowered(nodes, inputs, {"t0": (4, 7), "y": (4, 7)})
    fused = fuse_elementwise(program)
    assert len(fused.kernels) == 2
    assert_same(program, fused, feed_for(inputs))


def test_two_consumers_are_not_inlined():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["t0"]),
        helper.make_node("Relu", ["t0"], ["t1"]),
        helper.make_node("Mul", ["t0", "t1"], ["y"]),
    ]
    inputs = {"x": (4, 7), "b": (7,)}
    program = lowered(nodes, inputs, {"y": (4, 7)})
    fused = fuse_elementwise(program)
    # Add stays (Relu and Mul read it); Relu, read only by Mul, is inlined into it
    assert [k.op_type for k in fused.kernels] == ["Add", "Relu+Mul"]
    assert "t0" in fused.buffers and "t1" not in fused.buffers
    assert_same(program, fused, feed_for(inputs))


def test_reduction_consumer_is_not_fused():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["t0"]),
        helper.make_node("ReduceSum", ["t0"], ["y"], keepdims=1),
    ]
    inputs = {"x": (4, 7), "b": (7,)}
    program = lowered(nodes, inputs, {"y": (1, 1)})
    assert len(fuse_elementwise(program).kernels) == 2


def test_expensive_producer_is_not_recomputed_per_broadcast_read():
    inputs = {"x": (6, 1), "z": (6, 9)}
    for op, fusable in [("Exp", False), ("Neg", True)]:
        nodes = [helper.make_node(op, ["x"], ["t0"]), helper.make_node("Add", ["t0", "z"], ["y"])]
        program = lowered(nodes, inputs, {"y": (6, 9)})
        fused = fuse_elementwise(program)
        assert len(fused.kernels) == (1 if fusable else 2), op
        assert_same(program, fused, feed_for(inputs))


def test_broadcast_producer_into_bigger_consumer():
    """T (3, 1) read broadcast by C over (2, 3, 5): the composed access drops C's dims."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["t0"]),
        helper.make_node("Sub", ["z", "t0"], ["y"]),
    ]
    inputs = {"x": (3, 1), "z": (2, 3, 5)}
    program = lowered(nodes, inputs, {"y": (2, 3, 5)})
    fused = fuse_elementwise(program)
    assert len(fused.kernels) == 1
    assert_same(program, fused, feed_for(inputs))


UNARY = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@st.composite
def chains(draw):
    """(nodes, input shapes, output shape) of a random elementwise chain whose binary
    operands broadcast against the running result (so it grows or stays)."""
    length = draw(st.integers(2, 6))
    kinds = draw(st.lists(st.sampled_from(UNARY + BINARY), min_size=length, max_size=length))
    operands = sum(k in BINARY for k in kinds)
    shapes = draw(broadcast_shapes(n=operands + 1, min_rank=0, max_rank=4))
    inputs = {"x": shapes[0]}
    nodes, current, shape = [], "x", shapes[0]
    for step, kind in enumerate(kinds):
        out = "y" if step == length - 1 else f"t{step}"
        if kind in UNARY:
            nodes.append(helper.make_node(kind, [current], [out]))
        else:
            name = f"z{len(inputs)}"
            inputs[name] = shapes[len(inputs)]
            args = [current, name] if draw(st.booleans()) else [name, current]
            nodes.append(helper.make_node(kind, args, [out]))
            shape = np.broadcast_shapes(shape, inputs[name])
        current = out
    return nodes, inputs, tuple(shape)


@fast(25)
@given(chains(), seeds)
def test_random_chains_match_unfused(chain, seed):
    nodes, inputs, shape = chain
    program = lowered(nodes, inputs, {"y": shape})
    fused = fuse_elementwise(program)
    assert len(fused.kernels) <= len(program.kernels)
    assert all(len(k.statements) == 1 for k in fused.kernels)
    assert_same(program, fused, feed_for(inputs, seed))
