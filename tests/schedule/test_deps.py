"""Dependences and legality: default schedules are legal; reorderings that break a
dependence raise ScheduleError naming a concrete pair of iterations."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from polyonnx.errors import ScheduleError
from polyonnx.frontend.graph import Graph, Node, Value
from polyonnx.krnl.ir import Kernel
from polyonnx.krnl.islutil import dim_names
from polyonnx.krnl.lower import lower
from polyonnx.schedule.deps import check_legal, dependences
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.tree import LoopNest, sequence_tree


def _program(nodes, inputs, outputs):
    graph = Graph(
        "g", tuple(inputs), tuple(outputs), tuple(nodes),
        MappingProxyType({}), MappingProxyType({}), 17,
    )  # fmt: skip
    return lower(graph)


@pytest.fixture(scope="module")
def program():
    return _program(
        [
            Node("mm", "MatMul", ("A", "B"), ("T",), opset=17),
            Node("sm", "Softmax", ("T",), ("Y",), opset=17),
            Node("rs", "ReduceSum", ("Y",), ("Z",), {"keepdims": 0}, opset=11),
        ],
        [Value("A", (4, 6), "float32"), Value("B", (6, 5), "float32")],
        [Value("Z", (), "float32")],
    )


def test_default_schedules_are_legal(program):
    for kernel in program.kernels:
        deps = dependences(kernel)
        assert not deps.is_empty(), kernel.name
        check_legal(default_schedule(kernel, program.buffers), deps)


def test_matmul_reduction_carries_k(program):
    deps = dependences(program.kernel("mm"))
    text = str(deps)
    # the update reads and writes T[i, j] for every k: k -> k' > k on the same (i, j)
    assert "S1[i, j, k] -> S1[i' = i, j' = j, k']" in text or "S1[i, j, k] -> S1[i, j, k']" in text


def test_reversing_the_reduction_order_is_still_checked(program):
    kernel = program.kernel("mm")
    # running k outermost keeps every (i, j) chain in order: legal
    check_legal(sequence_tree(kernel, [LoopNest(("i", "j")), LoopNest(("k", "i", "j"))]))


def test_statement_reordering_is_illegal(program):
    kernel = program.kernel("sm")
    swapped = Kernel(
        kernel.name,
        kernel.op_type,
        (kernel.statements[2], *kernel.statements[:2], *kernel.statements[3:]),
    )
    nests = [LoopNest(tuple(dim_names(stmt))) for stmt in swapped.statements]
    with pytest.raises(ScheduleError) as err:
        check_legal(sequence_tree(swapped, nests), dependences(kernel))
    message = str(err.value)
    assert "'sm'" in message
    assert re.search(r"S\d+\[d0=\d+(, r1=\d+)?\] before S\d+\[d0=\d+", message)


def test_init_after_update_is_illegal(program):
    kernel = program.kernel("mm")
    swapped = Kernel(kernel.name, kernel.op_type, kernel.statements[::-1])
    schedule = sequence_tree(swapped, [LoopNest(("i", "k", "j")), LoopNest(("i", "j"))])
    with pytest.raises(ScheduleError, match=r"S0\[i=\d+, j=\d+\] before S1\[i=\d+, j=\d+, k=\d+\]"):
        check_legal(schedule, dependences(kernel))
