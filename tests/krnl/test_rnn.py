"""RNN, GRU and LSTM (polyonnx/krnl/ops/rnn.py) against a float64 numpy reference that
follows the ONNX spec's equations, itself cross-checked against onnxruntime (the ONNX
reference evaluator ignores sequence_lens, activations, clip and input_forget)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from onnx import helper

import polyonnx
from tests.helpers import Const, assert_matches, const, fast, make_model, seeds, value_info

OPS = ("RNN", "GRU", "LSTM")
DIRECTIONS = ("forward", "reverse", "bidirectional")
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
PER_DIRECTION = {"RNN": 1, "GRU": 2, "LSTM": 3}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
TOL = {"rtol": 2e-4, "atol": 2e-5}

# name: (takes alpha, takes beta, default alpha, default beta) — the ONNX operators' defaults
ACTIVATIONS = {
    "Relu": (False, False, 0.0, 0.0),
    "Tanh": (False, False, 0.0, 0.0),
    "Sigmoid": (False, False, 0.0, 0.0),
    "Affine": (True, True, 1.0, 0.0),
    "LeakyRelu": (True, False, 0.01, 0.0),
    "ThresholdedRelu": (True, False, 1.0, 0.0),
    "ScaledTanh": (True, True, 1.0, 1.0),
    "HardSigmoid": (True, True, 0.2, 0.5),
    "Elu": (True, False, 1.0, 0.0),
    "Softsign": (False, False, 0.0, 0.0),
    "Softplus": (False, False, 0.0, 0.0),
}


# ---- the numpy reference ---------------------------------------------------------------


def activation(name: str, alpha: float, beta: float):
    return {
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "affine": lambda x: alpha * x + beta,
        "leakyrelu": lambda x: np.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: np.where(x > alpha, x, 0),
        "scaledtanh": lambda x: alpha * np.tanh(beta * x),
        "hardsigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "elu": lambda x: np.where(x >= 0, x, alpha * np.expm1(x)),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.logaddexp(0, x),
    }[name.lower()]


def resolve_activations(op, dirs, names=None, alphas=(), betas=()):
    """Per direction, the activation functions: names default per op, one set given for
    a bidirectional node serves both, alphas/betas are consumed in order by the
    activations that take them."""
    names = list(names) if names else DEFAULT_ACTS[op] * dirs
    alphas, betas = list(alphas), list(betas)
    funcs = []
    for name in names:
        key = next(k for k in ACTIVATIONS if k.lower() == name.lower())
        takes_a, takes_b, alpha, beta = ACTIVATIONS[key]
        if takes_a and alphas:
            alpha = alphas.pop(0)
        if takes_b and betas:
            beta = betas.pop(0)
        funcs.append(activation(name, alpha, beta))
    n = PER_DIRECTION[op]
    if len(funcs) == n and dirs == 2:
        funcs *= 2
    return [funcs[d * n : (d + 1) * n] for d in range(dirs)]


def reference(
    op, x, w, r, b=None, lens=None, h0=None, c0=None, p=None, *, direction="forward",
    layout=0, clip=None, activations=None, activation_alpha=(), activation_beta=(),
    input_forget=0, linear_before_reset=0, **_,
):  # fmt: skip
    """Y, Y_h, Y_c (Y_c only for LSTM) of the ONNX equations, in float64."""
    dtype = x.dtype
    x, w, r = (a.astype(np.float64) for a in (x, w, r))
    if layout:
        x = x.swapaxes(0, 1)
        h0 = None if h0 is None else h0.swapaxes(0, 1)
        c0 = None if c0 is None else c0.swapaxes(0, 1)
    seq, batch, _ = x.shape
    dirs, hid = w.shape[0], r.shape[2]
    gates = GATES[op]
    b = np.zeros((dirs, 2 * gates * hid)) if b is None else b.astype(np.float64)
    p = np.zeros((dirs, 3 * hid)) if p is None else p.astype(np.float64)
    lens = np.full(batch, seq) if lens is None else lens
    acts = resolve_activations(op, dirs, activations, activation_alpha, activation_beta)

    def cl(v):
        return v if clip is None else np.clip(v, -clip, clip)

    y = np.zeros((seq, dirs, batch, hid))
    y_h, y_c = np.zeros((dirs, batch, hid)), np.zeros((dirs, batch, hid))
    for d in range(dirs):
        f = acts[d]
        h = np.zeros((batch, hid)) if h0 is None else h0[d].astype(np.float64)
        c = np.zeros((batch, hid)) if c0 is None else c0[d].astype(np.float64)
        wb, rb = np.split(b[d], 2)
        backwards = direction == "reverse" or d == 1
        for t in reversed(range(seq)) if backwards else range(seq):
            valid = (t < lens)[:, None]
            xw, hr = x[t] @ w[d].T, h @ r[d].T
            if op == "RNN":
                new = f[0](cl(xw + hr + wb + rb))
            elif op == "GRU":
                xz, xr, xh = np.split(xw, 3, axis=1)
                hz, hrr, _ = np.split(hr, 3, axis=1)
                wz, wr, wh = np.split(wb, 3)
                rz, rr, rh = np.split(rb, 3)
                z = f[0](cl(xz + hz + wz + rz))
                reset = f[0](cl(xr + hrr + wr + rr))
                r_h = r[d][2 * hid :]
                if linear_before_reset:
                    cand = f[1](cl(xh + reset * (h @ r_h.T + rh) + wh))
                else:
                    cand = f[1](cl(xh + (reset * h) @ r_h.T + rh + wh))
                new = (1 - z) * cand + z * h
            else:
                gi, go, gf, gc = np.split(xw + hr + wb + rb, 4, axis=1)
                pi, po, pf = np.split(p[d], 3)
                i = f[0](cl(gi + pi * c))
                forget = 1 - i if input_forget else f[0](cl(gf + pf * c))
                c_new = forget * c + i * f[1](cl(gc))
                o = f[0](cl(go + po * c_new))
                new = o * f[2](c_new)
                c = np.where(valid, c_new, c)
            h = np.where(valid, new, h)
            y[t, d] = np.where(valid, new, 0)
        y_h[d], y_c[d] = h, c
    if layout:
        y, y_h, y_c = y.transpose(2, 0, 1, 3), y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)
    outs = [y, y_h, y_c] if op == "LSTM" else [y, y_h]
    return [o.astype(dtype) for o in outs]


# ---- models ------------------------------------------------------------------------------


@dataclass
class Case:
    """One RNN/GRU/LSTM node: its inputs (None: absent), attributes and which outputs
    the model asks for."""

    op: str
    args: list
    attrs: dict = field(default_factory=dict)
    want: tuple[bool, ...] = (True, True, True)
    opset: int = 22

    def expected(self) -> list[np.ndarray]:
        values = [a.value if isinstance(a, Const) else a for a in self.args]
        outs = reference(self.op, *values, **self.attrs)
        return [o for o, wanted in zip(outs, self.want, strict=False) if wanted]

    def model(self) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        names, inputs, feed, constants = [], [], {}, {}
        for i, arg in enumerate(self.args):
            if arg is None:
                names.append("")
            elif isinstance(arg, Const):
                names.append(f"x{i}")
                constants[f"x{i}"] = arg.value
            else:
                names.append(f"x{i}")
                inputs.append(value_info(f"x{i}", arg.dtype, arg.shape))
                feed[f"x{i}"] = arg
        count = 3 if self.op == "LSTM" else 2
        want = list(self.want[:count])
        while not want[-1]:
            want.pop()
        outs = [f"y{i}" if wanted else "" for i, wanted in enumerate(want)]
        node = helper.make_node(self.op, names, outs, name=f"{self.op.lower()}_node", **self.attrs)
        dtype = self.args[0].dtype
        infos = [value_info(n, dtype, [None] * (4 if i == 0 else 3)) for i, n in enumerate(outs)]
        infos = [info for info, n in zip(infos, outs, strict=True) if n]
        return make_model([node], inputs, infos, constants, self.opset), feed

    def run(self) -> list[np.ndarray]:
        model, feed = self.model()
        return polyonnx.InferenceSession(model).run(None, feed)

    def assert_matches_reference(self, tol=TOL) -> None:
        got, expected = self.run(), self.expected()
        assert len(got) == len(expected)
        for actual, want in zip(got, expected, strict=True):
            assert_matches(actual, want, tol)


def make_case(
    rng, op, direction, *, seq, batch, inputs, hidden, layout=0, dtype=np.float32,
    bias=True, lens=False, h0=False, c0=False, peep=False, **attrs,
) -> Case:  # fmt: skip
    """Random inputs of the right shapes, weights scaled so states stay O(1)."""
    dirs, gates = (2 if direction == "bidirectional" else 1), GATES[op]
    scale = 1 / np.sqrt(max(inputs, hidden))

    def rand(*shape, s=1.0):
        return (rng.uniform(-1, 1, size=shape) * s).astype(dtype)

    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    x = rand(*((batch, seq, inputs) if layout else (seq, batch, inputs)))
    args = [
        x,
        rand(dirs, gates * hidden, inputs, s=scale),
        rand(dirs, gates * hidden, hidden, s=scale),
        rand(dirs, 2 * gates * hidden, s=0.5) if bias else None,
        rng.integers(1, seq + 1, size=batch).astype(np.int32) if lens else None,
        rand(*state) if h0 else None,
        rand(*state) if c0 and op == "LSTM" else None,
        rand(dirs, 3 * hidden, s=0.5) if peep and op == "LSTM" else None,
    ]
    while args[-1] is None:
        args.pop()
    attrs = {"hidden_size": hidden, "direction": direction, **attrs}
    if layout:
        attrs["layout"] = layout
    return Case(op, args, attrs)


# ---- the reference against onnxruntime ----------------------------------------------------


def run_onnxruntime(case: Case) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    model, feed = case.model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


@st.composite
def activation_attrs(draw, op: str, dirs: int) -> dict:
    """activations for every direction (or one set for both), with explicit alphas and
    betas for all that take them (onnxruntime's own defaults differ from the spec's for
    ThresholdedRelu, Affine and ScaledTanh)."""
    sets = draw(st.sampled_from([1, dirs]))
    names = draw(
        st.lists(st.sampled_from(sorted(ACTIVATIONS)), min_size=PER_DIRECTION[op] * sets,
                 max_size=PER_DIRECTION[op] * sets)
    )  # fmt: skip
    if sets == 1 and dirs == 2:
        names = names * 2
    params = st.floats(0.1, 1.5).map(lambda v: round(v, 2))
    alphas = [draw(params) for n in names if ACTIVATIONS[n][0]]
    betas = [draw(params) for n in names if ACTIVATIONS[n][1]]
    attrs: dict = {"activations": names}
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    return attrs


@pytest.mark.parametrize("op", OPS)
@fast(40)
@given(
    direction=st.sampled_from(DIRECTIONS),
    seq=st.sampled_from([1, 2, 3, 5]),
    batch=st.sampled_from([1, 2, 3]),
    hidden=st.sampled_from([1, 3, 5]),
    flags=st.lists(st.booleans(), min_size=5, max_size=5),
    clip=st.one_of(st.none(), st.sampled_from([0.5, 2.0])),
    special=st.booleans(),
    data=st.data(),
    seed=seeds,
)
def test_reference_matches_onnxruntime(
    op, direction, seq, batch, hidden, flags, clip, special, data, seed
):
    """The numpy reference is what onnxruntime computes: sequence_lens, clip, every
    activation with its alpha/beta, input_forget, linear_before_reset, peepholes.
    (onnxruntime has no layout=1; the conformance cases *_batchwise cover it.)"""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    attrs = data.draw(activation_attrs(op, dirs)) if data.draw(st.booleans()) else {}
    if clip is not None:
        attrs["clip"] = clip
    if special and op == "GRU":
        attrs["linear_before_reset"] = 1
    if special and op == "LSTM":
        attrs["input_forget"] = 1
    case = make_case(
        rng, op, direction, seq=seq, batch=batch, inputs=3, hidden=hidden,
        bias=flags[0], lens=flags[1], h0=flags[2], c0=flags[3], peep=flags[4], **attrs,
    )  # fmt: skip
    expected = case.expected()
    # unbounded activations (Relu, Affine, Softplus…) can explode; onnxruntime then
    # overflows to inf in float32 where the reference does not: compare sane examples
    assume(all(np.all(np.abs(w) < 1e3) for w in expected))
    for actual, want in zip(run_onnxruntime(case), expected, strict=True):
        np.testing.assert_allclose(actual, want, rtol=1e-4, atol=1e-5)


# ---- polyonnx against the reference ----------------------------------------------------------

SIZES = st.sampled_from([1, 2, 3, 5, 7, 16, 17])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@fast(3)
@given(
    seq=st.sampled_from([1, 2, 3, 5]),
    batch=st.sampled_from([1, 2, 3, 5]),
    inputs=SIZES,
    hidden=SIZES,
    layout=st.sampled_from([0, 1]),
    flags=st.lists(st.booleans(), min_size=5, max_size=5),
    want=st.lists(st.booleans(), min_size=3, max_size=3).filter(any),
    seed=seeds,
)
def test_recurrent_layer(op, direction, seq, batch, inputs, hidden, layout, flags, want, seed):
    """Every size, layout, optional input (B, sequence_lens, initial_h, initial_c, P) and
    any subset of the outputs."""
    rng = np.random.default_rng(seed)
    case = make_case(
        rng, op, direction, seq=seq, batch=batch, inputs=inputs, hidden=hidden, layout=layout,
        bias=flags[0], lens=flags[1], h0=flags[2], c0=flags[3], peep=flags[4],
    )  # fmt: skip
    case.want = tuple(want) if op == "LSTM" or any(want[:2]) else (True, False)
    case.assert_matches_reference()


@pytest.mark.parametrize(
    ("op", "extra"),
    [
        ("RNN", {}),
        ("GRU", {}),
        ("GRU", {"linear_before_reset": 1}),
        ("LSTM", {}),
        ("LSTM", {"input_forget": 1}),
    ],
)
@fast(3)
@given(direction=st.sampled_from(DIRECTIONS), clip=st.sampled_from([None, 0.7]), data=st.data())
def test_activations_clip_and_variants(op, extra, direction, clip, data):
    """Any activation in any slot (alpha/beta given or defaulted), clip, and the GRU/LSTM
    variants, with every optional input present."""
    rng = np.random.default_rng(data.draw(seeds))
    dirs = 2 if direction == "bidirectional" else 1
    attrs = data.draw(activation_attrs(op, dirs))
    if data.draw(st.booleans()):  # fall back to the operators' default alpha/beta
        attrs.pop("activation_alpha", None)
        attrs.pop("activation_beta", None)
    attrs |= extra | ({} if clip is None else {"clip": clip})
    case = make_case(
        rng, op, direction, seq=2, batch=2, inputs=5, hidden=7, lens=True, h0=True, c0=True,
        peep=True, **attrs,
    )  # fmt: skip
    case.assert_matches_reference()


@pytest.mark.parametrize(("op", "seq"), [("RNN", 17), ("GRU", 7), ("LSTM", 13)])
def test_long_sequences_with_ragged_lengths(op, seq):
    rng = np.random.default_rng(seq)
    case = make_case(
        rng, op, "bidirectional", seq=seq, batch=5, inputs=3, hidden=17, lens=True, h0=True,
        c0=True, peep=True,
    )  # fmt: skip
    case.args[4] = np.array([seq, 1, seq - 1, 5, 2], np.int32)
    case.assert_matches_reference()


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(np.float64, {"rtol": 1e-9, "atol": 1e-12}), (np.float16, {"rtol": 4e-3, "atol": 1e-3})],
)
@pytest.mark.parametrize("op", OPS)
def test_other_float_types(op, dtype, tol):
    """float64 end to end; float16 tensors with float32 arithmetic (the state is
    rounded to float16 between steps)."""
    rng = np.random.default_rng(1)
    case = make_case(
        rng, op, "bidirectional", seq=3, batch=2, inputs=3, hidden=5, dtype=dtype,
        lens=True, h0=True, c0=True, peep=True,
    )  # fmt: skip
    case.assert_matches_reference(tol)


@pytest.mark.parametrize("op", OPS)
def test_opset_7(op):
    """Before opset 14 there is no layout attribute."""
    rng = np.random.default_rng(2)
    case = make_case(rng, op, "reverse", seq=3, batch=2, inputs=3, hidden=4, lens=True, h0=True)
    case.opset = 7
    case.assert_matches_reference()


@pytest.mark.parametrize("full", [True, False])
def test_constant_weights_and_lengths(full):
    """W, R, B and sequence_lens as initializers (as exported models have them); when
    every length is full the masks are dropped."""
    rng = np.random.default_rng(3)
    case = make_case(rng, "LSTM", "forward", seq=5, batch=3, inputs=3, hidden=5, lens=True)
    case.args[4] = np.array([5, 5, 5] if full else [5, 2, 4], np.int32)
    case.args = [case.args[0], *(const(a) for a in case.args[1:])]
    case.assert_matches_reference()


def test_one_kernel_per_time_step():
    from polyonnx.frontend import load_graph
    from polyonnx.krnl.lower import lower

    rng = np.random.default_rng(4)
    case = make_case(rng, "GRU", "bidirectional", seq=4, batch=2, inputs=3, hidden=5)
    graph = load_graph(case.model()[0])
    names = [k.name for k in lower(graph).kernels]
    assert names[:6] == [
        f"gru_node.{p}" for p in ("init", "proj", "step0", "step1", "step2", "step3")
    ]


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_one_activation_set_serves_both_directions(op):
    """Leniently (onnxruntime refuses it), a bidirectional node given one direction's
    activations uses them, with their alphas and betas, in both directions."""
    names = ["HardSigmoid", "LeakyRelu", "Tanh"][: PER_DIRECTION[op]]
    attrs = {"activations": names, "activation_alpha": [0.3, 0.2], "activation_beta": [0.4]}
    case = make_case(
        np.random.default_rng(5), op, "bidirectional", seq=2, batch=2, inputs=3, hidden=3,
        h0=True, **attrs,
    )  # fmt: skip
    case.assert_matches_reference()


# ---- refusals ------------------------------------------------------------------------------


def expect_lowering_error(case: Case, match: str) -> None:
    with pytest.raises(polyonnx.LoweringError, match=match):
        case.run()


def _small(op="RNN", **attrs) -> Case:
    return make_case(np.random.default_rng(0), op, "forward", seq=2, batch=1, inputs=2, hidden=3,
                     **attrs)  # fmt: skip


def test_unknown_activation_is_refused():
    expect_lowering_error(_small(activations=["Gelu"]), r"rnn_node.*unknown activation 'gelu'")


def test_wrong_activation_count_is_refused():
    case = _small("GRU", activations=["Tanh", "Tanh", "Tanh"])
    expect_lowering_error(case, r"gru_node.*3 activations given, expected 2 per direction")


def test_hidden_size_must_match_r():
    case = _small()
    case.attrs["hidden_size"] = 4
    expect_lowering_error(case, r"rnn_node.*hidden_size=4.*\(1, 3, 3\)")


def test_integer_input_is_refused():
    case = _small()
    case.args = [a.astype(np.int32) if a is not None else None for a in case.args]
    with pytest.raises(polyonnx.PolyonnxError):
        case.run()
