"""Einsum (polyonnx/krnl/ops/einsum.py) against numpy.einsum: the common patterns by
name, random equations (repeated subscripts, sums, permutations), ellipses, broadcasting,
and malformed equations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyonnx.errors import LoweringError
from polyonnx.krnl.ops.einsum import parse
from tests.helpers import check_node, fast, random_array, run_node, seeds, sum_tol

OPSET = 12

PATTERNS = {
    "matmul": ("ij,jk->ik", [(5, 7), (7, 3)]),
    "batched matmul": ("bij, bjk -> bik", [(2, 5, 7), (2, 7, 17)]),
    "transpose": ("ij->ji", [(3, 17)]),
    "permute 4-d": ("abcd->cadb", [(2, 3, 5, 7)]),
    "trace": ("ii", [(13, 13)]),
    "diagonal": ("ii->i", [(13, 13)]),
    "batch diagonal": ("...ii ->...i", [(3, 5, 5)]),
    "triple diagonal": ("iji->j", [(3, 4, 3)]),
    "sum over one axis": ("ij->i", [(3, 33)]),
    "sum over all": ("ij->", [(3, 33)]),
    "outer product": ("i,j->ij", [(5,), (17,)]),
    "inner product": ("i,i", [(33,)] * 2),
    "bilinear": ("bn,anm,bm->ba", [(2, 3), (5, 3, 4), (2, 4)]),
    "implicit output": ("ba,ac", [(3, 4), (4, 5)]),
    "implicit, upper before lower": ("Ba", [(3, 4)]),
    "ellipsis broadcast": ("...ij,...jk", [(2, 3, 4), (5, 1, 4, 6)]),
    "ellipsis in the middle": ("i...j,j...->i...", [(2, 3, 4), (4, 3)]),
    "size-1 subscript broadcast": ("ij,j->i", [(3, 4), (1,)]),
    "scalar": ("->", [()]),
    "scalar times tensor": (",ij->ij", [(), (3, 4)]),
    "attention scores": ("bhqd,bhkd->bhqk", [(1, 2, 5, 16), (1, 2, 7, 16)]),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern(name):
    equation, shapes = PATTERNS[name]
    rng = np.random.default_rng(0)
    xs = [random_array(rng, shape, np.float32, -1, 1) for shape in shapes]
    check_node("Einsum", xs, np.einsum(equation, *xs), tol=sum_tol(64), opset=OPSET,
               equation=equation)  # fmt: skip


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_other_dtypes(dtype):
    rng = np.random.default_rng(1)
    xs = [random_array(rng, s, dtype, -5, 5) for s in [(2, 3, 4), (2, 4, 5)]]
    check_node("Einsum", xs, np.einsum("bij,bjk->bik", *xs), opset=OPSET, equation="bij,bjk->bik")


@st.composite
def equations(draw):
    """Random equations over up to 5 subscripts: each operand a random sequence of them
    (repeats make diagonals), the output a random subset in random order."""
    letters = draw(st.lists(st.sampled_from("abcdeXY"), min_size=1, max_size=5, unique=True))
    sizes = {c: draw(st.sampled_from([1, 2, 3, 5, 7])) for c in letters}
    n = draw(st.integers(1, 3))
    terms = [draw(st.lists(st.sampled_from(letters), max_size=4)) for _ in range(n)]
    used = sorted({c for term in terms for c in term})
    output = draw(st.permutations(used).flatmap(lambda p: st.integers(0, len(p)).map(
        lambda k: p[:k])))  # fmt: skip
    equation = ",".join("".join(t) for t in terms) + "->" + "".join(output)
    return equation, [tuple(sizes[c] for c in term) for term in terms]


@fast(30)
@given(case=equations(), seed=seeds)
def test_random_equations(case, seed):
    equation, shapes = case
    rng = np.random.default_rng(seed)
    xs = [random_array(rng, shape, np.float32, -1, 1) for shape in shapes]
    want = np.asarray(np.einsum(equation, *xs), np.float32)
    check_node("Einsum", xs, want, tol=sum_tol(300), opset=OPSET, equation=equation)


# ---- parsing and refusals ------------------------------------------------------------


def test_parse_labels_ellipsis_dims_from_the_right():
    eq = parse("...ij,j...->i...", [4, 2])
    assert eq.inputs == ((".0", ".1", "i", "j"), ("j", ".1"))
    assert eq.output == ("i", ".0", ".1")
    assert parse("ba,ac", [2, 2]).output == ("b", "c")


@pytest.mark.parametrize(
    ("equation", "ranks", "message"),
    [
        ("ij,jk->ik", [2], "operands"),
        ("ij->kk", [2], "repeats in the output"),
        ("ij->k", [2], "in no input"),
        ("ijk->ij", [2], "does not match"),
        ("ij->ij", [3], "does not match"),
        ("i1->i", [2], "bad einsum term"),
        ("...ij->ij", [3], "no '...'"),
    ],
)
def test_parse_refuses_malformed_equations(equation, ranks, message):
    with pytest.raises(ValueError, match=message):
        parse(equation, ranks)


def test_mismatched_sizes_are_a_lowering_error():
    a, b = np.zeros((3, 4), np.float32), np.zeros((5, 6), np.float32)
    with pytest.raises(LoweringError, match="subscript 'j' has sizes 4 and 5"):
        run_node("Einsum", [a, b], [np.zeros((3, 6), np.float32)], opset=OPSET,
                 equation="ij,jk->ik")  # fmt: skip


def test_bad_equation_is_a_lowering_error():
    a = np.zeros((3, 4), np.float32)
    with pytest.raises(LoweringError, match="Einsum node"):
        run_node("Einsum", [a], [a], opset=OPSET, equation="ij->kk")
