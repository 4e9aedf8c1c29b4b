"""krnl/params.py: integer polynomials in the parameters, the fit of size-dependent
integers and isl strings from lowerings at the sample points, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from polyonnx.frontend.load import load_graph
from polyonnx.krnl.lower import lower, supported_ops
from polyonnx.krnl.params import (
    BASE,
    CHECKS,
    STEPS,
    Fit,
    NotParametric,
    Poly,
    parameter_value,
    parameters,
    parametric_program,
    sample_points,
)
from polyonnx.runtime.parametric import ParametricModel, graph_at
from polyonnx.runtime.session import InferenceSession
from tests.helpers import make_model, value_info

S = Poly.symbol("S")
B = Poly.symbol("B")
SMALL = st.integers(-20, 20)
POINTS = st.fixed_dictionaries({"S": st.integers(0, 300), "B": st.integers(0, 300)})


def fit(*symbols: str) -> Fit:
    return Fit(symbols, sample_points(symbols))


def values(f: Fit, rule) -> list[int]:
    """``rule`` of each sample point of ``f``."""
    return [rule(p) for p in f.points]


# ---- Poly --------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(a=SMALL, b=SMALL, c=SMALL, d=SMALL, point=POINTS)
def test_poly_add_mul_at_agree_with_integers(a, b, c, d, point):
    """(a*S + b) + (c*B + d) and their product evaluate as the integers do."""
    p, q = a * S + b, c * B + d
    s, n = point["S"], point["B"]
    assert (p + q).at(point) == a * s + b + c * n + d
    assert (p * q).at(point) == (a * s + b) * (c * n + d)
    assert (p + 0).at(point) == p.at(point)
    assert (p * 0).terms == ()


def test_poly_terms_cancel_and_constants():
    """Terms that cancel are dropped; a polynomial without symbols is its constant."""
    assert Poly.of(3) == (S + 3) + (S * -1)
    assert Poly.of(3).constant == 3
    assert Poly.of(0) == Poly(()) and Poly(()).constant == 0
    assert (S + 1).constant is None
    assert (S * B + S).symbols == frozenset({"S", "B"})


def test_poly_isl_text():
    """Affine polynomials print as isl reads them, a product of two as one parameter."""
    assert (2 * S + 3).isl() == "(3 + 2*S)"
    assert Poly(()).isl() == "(0)"
    assert (S * B).isl() == "(1*B_x_S)"
    assert (S * B + -4).isl() == "(-4 + 1*B_x_S)"
    assert (S * B).isl_names == frozenset({"B_x_S"})
    assert parameter_value("B_x_S", {"B": 3, "S": 7}) == 21
    assert str(2 * S * S + 1) == "1 + 2*S^2"


def test_poly_isl_refuses_a_cube():
    """isl holds no product of three: NotParametric naming the polynomial."""
    with pytest.raises(NotParametric, match=r"S\^3 is not affine"):
        (S * S * S).isl()


# ---- Fit.number ----------------------------------------------------------------------


def test_sample_points():
    """Every symbol at BASE, each in turn at STEPS, then all at CHECKS."""
    points = sample_points(("B", "S"))
    assert points[0] == {"B": BASE, "S": BASE}
    assert points[1 : 1 + len(STEPS)] == [{"B": s, "S": BASE} for s in STEPS]
    assert points[-len(CHECKS) :] == [{"B": c, "S": c} for c in CHECKS]
    assert parameters(("S",))[0] == "S" and parameters(("B", "S"))[:2] == ("B", "S")


@settings(max_examples=30, deadline=None)
@given(a=SMALL, b=SMALL)
def test_fit_affine(a, b):
    """a*S + b at the sample points fits a*S + b (a constant where a is 0)."""
    f = fit("S")
    got = f.number(values(f, lambda p: a * p["S"] + b), "dim")
    if a == 0:
        assert got == b and isinstance(got, int)
    else:
        assert got == a * S + b


def test_fit_two_symbols_and_their_product():
    """2*B*S + 3*S - B + 1 fits with B x S as a parameter of its own."""
    f = fit("B", "S")
    got = f.number(values(f, lambda p: 2 * p["B"] * p["S"] + 3 * p["S"] - p["B"] + 1), "dim")
    assert got == 2 * B * S + 3 * S + B * -1 + 1
    assert got.isl() == "(1 + -1*B + 2*B_x_S + 3*S)"


def test_fit_square():
    """S*S (an S x S score matrix's size) fits with S x S as a parameter of its own."""
    f = fit("S")
    got = f.number(values(f, lambda p: p["S"] * p["S"] * 4 + 2), "dim")
    assert got == S * S * 4 + 2
    assert got.isl() == "(2 + 4*S_x_S)"


@pytest.mark.parametrize(
    "rule",
    [lambda s: s * s * s, lambda s: s // 2, lambda s: 1 << (s % 7), lambda s: s % 4],
    ids=["cube", "half", "power", "modulo"],
)
def test_fit_refuses_what_is_not_affine(rule):
    """Values that no affine function (with products of two) takes: NotParametric
    naming where they came from and the values."""
    f = fit("S")
    numbers = values(f, lambda p: rule(p["S"]))
    with pytest.raises(NotParametric, match=r"buffer 't'.*is not affine in \('S',\)"):
        f.number(numbers, "buffer 't'")


# ---- Fit.text ------------------------------------------------------------------------


def test_fit_text_parametrises_size_dependent_integers():
    """The integers that follow the sizes become polynomials, the others stay; names
    with digits (S0, i1) and decimals are left alone."""
    f = fit("S")
    texts = values(
        f,
        lambda p: (
            f"{{ S0[i0, i1] : 0 <= i0 < {p['S']} and 0 <= i1 < 8 and i0 + 3 <= {2 * p['S'] + 1} }}"
        ),
    )
    text = f.text(texts, "domain")
    assert text.startswith("[S") and "] -> " in text
    assert text.endswith("{ S0[i0, i1] : 0 <= i0 < (1*S) and 0 <= i1 < 8 and i0 + 3 <= (1 + 2*S) }")


def test_fit_text_refuses_a_change_of_form():
    """A string whose words change with the sizes (not just its integers) is refused."""
    f = fit("S")
    texts = values(f, lambda p: "{ S0[i] : i < 4 }" if p["S"] < 50 else "{ S0[i] : i <= 4 }")
    with pytest.raises(NotParametric, match="changes form"):
        f.text(texts, "domain")


def test_fit_text_refuses_a_size_that_multiplies():
    """``2*S`` in isl would be fine, but ``S*i`` would not: a size next to * or / is refused."""
    f = fit("S")
    texts = values(f, lambda p: f"{{ A[i] -> B[{p['S']}*i] }}")
    with pytest.raises(NotParametric, match="multiplies or divides"):
        f.text(texts, "index")


# ---- a model lowered at the sample points ----------------------------------------------


def range_model():
    """y = x + Range(0, S): Range of a size computed by Shape, folded into a constant."""
    f = np.float32
    nodes = [
        ("Shape", ["x"], ["shape"], {}),
        ("Gather", ["shape", "zero"], ["n"], {"axis": 0}),
        ("Range", ["zero", "n", "one"], ["r"], {}),
        ("Cast", ["r"], ["rf"], {"to": 1}),
        ("Add", ["x", "rf"], ["y"], {}),
    ]
    return make_model(
        [helper.make_node(op, i, o, name=o[0], **a) for op, i, o, a in nodes],
        [value_info("x", f, ["S"])],
        [value_info("y", f, ["S"])],
        {"zero": np.array(0, np.int64), "one": np.array(1, np.int64)},
        17,
    )


def test_size_dependent_constant_is_not_parametric():
    """The folded Range is a constant that differs at every size: NotParametric naming it."""
    model = range_model()

    def load(shapes):
        return load_graph(
            model, merge=False, supported_ops=supported_ops(), input_shapes=shapes, checked=True
        )

    graph = load_graph(model, supported_ops=supported_ops(), checked=True)
    with pytest.raises(NotParametric, match=r"constant 'rf' depends on the sizes"):
        parametric_program(["S"], lambda point: lower(graph_at(graph.inputs, load)(point)))


def test_session_folds_it_per_size():
    """A session compiles that model once: the constant is the graph's own, folded again
    at each new size (runtime/parametric.py's Derived), past the sizes lowered too."""
    session = InferenceSession(range_model(), threads=1, cache=False)
    for n in (3, 9, 300, 3):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        (y,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, x + np.arange(n, dtype=np.float32))
    assert isinstance(session._parametric, ParametricModel), session.not_parametric
    assert session._parametric.derived.names == ("rf",)
    assert session.compile_count == 1
