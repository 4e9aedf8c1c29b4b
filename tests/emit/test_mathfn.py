"""Accuracy and code-shape tests of polyonnx.emit.mathfn.

Every op is emitted inside a tiny loop ``out[i] = op(in[i])`` (scalar ``float``,
``<16 x float>``, scalar ``double`` and ``<8 x double>``), optimised at O3 for the host CPU,
JIT-compiled and run over dense sweeps of inputs (>= 1e6 points per float op, special values
included).  Results are compared with numpy float64 (math.erf for erf).  The bounds asserted
are the measured maxima with about 1.5-2x headroom; docs/mathfn.md lists the measured values.
"""

from __future__ import annotations

import ctypes
import functools
import math
import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from polyonnx.emit.mathfn import MATH_OPS, emit_math, emit_pow

F32, F64 = ir.FloatType(), ir.DoubleType()
OPS = sorted(MATH_OPS)
F32_TINY = float(np.finfo(np.float32).tiny)
F64_TINY = float(np.finfo(np.float64).tiny)

# --------------------------------------------------------------------------------------
# JIT harness (may later move to polyonnx/emit/jit.py).
# --------------------------------------------------------------------------------------


def _target_machine() -> llvm.TargetMachine:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=3,
        jit=True,
    )


def _add_loop(mod: ir.Module, name: str, elem: ir.Type, lanes: int, nin: int, body) -> None:
    """``void name(ptr in_0, ..., ptr out, i64 n)``: for i < n, out[i] = body(in_j[i]) on
    ``lanes``-wide chunks (n counts chunks)."""
    ty = elem if lanes == 1 else ir.VectorType(elem, lanes)
    i64 = ir.IntType(64)
    fn = ir.Function(
        mod, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * (nin + 1) + [i64]), name
    )
    *ins, out, n = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    align = 4 if elem == F32 else 8
    xs = [b.load(b.gep(p, [i], source_etype=ty), typ=ty, align=align) for p in ins]
    b.store(body(b, *xs), b.gep(out, [i], source_etype=ty), align=align)
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()


class _Jit:
    """One JIT-compiled module of loops: one per op, plus ``pow``.

    Each has its own target machine: the execution engine takes ownership of it."""

    def __init__(self, elem: ir.Type, lanes: int):
        tm = _target_machine()
        self.elem, self.lanes = elem, lanes
        self.dtype = np.float32 if elem == F32 else np.float64
        mod = ir.Module(name=f"mathfn_{elem}_{lanes}")
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.cpu_features = llvm.get_host_cpu_features().flatten()  # 16 floats: vscalefps
        for op in OPS:
            _add_loop(mod, op, elem, lanes, 1, lambda b, x, op=op: emit_math(b, op, x))
        _add_loop(mod, "pow", elem, lanes, 2, emit_pow)
        self.ir_text = str(mod)
        self.mod = llvm.parse_assembly(self.ir_text)
        self.mod.verify()
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
        pb.getModulePassManager().run(self.mod, pb)
        self.ee = llvm.create_mcjit_compiler(self.mod, tm)
        self.ee.finalize_object()
        self.asm = tm.emit_assembly(self.mod)
        self._fns = {}

    def _fn(self, name: str, nin: int):
        if name not in self._fns:
            proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (nin + 1), ctypes.c_int64)
            self._fns[name] = proto(self.ee.get_function_address(name))
        return self._fns[name]

    def __call__(self, name: str, *xs: np.ndarray) -> np.ndarray:
        xs = [np.asarray(x, dtype=self.dtype).ravel() for x in xs]
        size = xs[0].size
        padded = -(-size // self.lanes) * self.lanes
        ins = [np.ascontiguousarray(np.resize(x, padded)) for x in xs]
        out = np.empty(padded, dtype=self.dtype)
        self._fn(name, len(ins))(
            *[a.ctypes.data for a in ins], out.ctypes.data, padded // self.lanes
        )
        return out[:size]


@pytest.fixture(scope="module")
def jits() -> dict[str, _Jit]:
    return {
        "f32x1": _Jit(F32, 1),
        "f32x16": _Jit(F32, 16),
        "f64x1": _Jit(F64, 1),
        "f64x8": _Jit(F64, 8),
    }


# --------------------------------------------------------------------------------------
# References and inputs.
# --------------------------------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x < 0, e, 1.0) / (1.0 + e)


REF = {
    "exp": np.exp,
    "expneg": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "softplus": lambda x: np.logaddexp(0.0, x),
    "erf": lambda x: _erf(x).astype(np.float64),
    "sin": np.sin,
    "cos": np.cos,
}

N = 1 << 20
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-30, -1e-30, 5e-45, -5e-45]


def _both_signs(a):
    return np.concatenate([a, -a])


def _logspace(lo, hi, n=N):
    return 10.0 ** np.linspace(lo, hi, n)


def inputs(op: str, dtype) -> np.ndarray:
    """Dense sweeps over the ranges each op is specified on, plus special values."""
    big = 300 if dtype == np.float64 else 30
    lin = np.linspace
    sweeps = {
        "exp": [lin(-87.0, 88.0, N), _both_signs(_logspace(-30, 0, N // 8))],
        "expneg": [lin(-120.0 if dtype == np.float32 else -750.0, 0.0, N), -_logspace(-30, 0)],
        "expm1": [lin(-20.0, 88.0, N), _both_signs(_logspace(-30, 0, N // 4))],
        "log": [_logspace(-big, big), 1.0 + lin(-0.3, 0.5, N // 4)],
        "log1p": [_both_signs(_logspace(-30, -0.01, N // 2)), _logspace(-2, big, N // 2)],
        "tanh": [lin(-10.0, 10.0, N), _both_signs(_logspace(-30, 1, N // 4))],
        "sigmoid": [lin(-80.0, 80.0, N)],
        "softplus": [lin(-80.0, 80.0, N), _both_signs(_logspace(-30, big, N // 8))],
        "erf": [lin(-5.0, 5.0, N), _both_signs(_logspace(-30, 0, N // 4))],
        "sin": [lin(-100.0, 100.0, N), _both_signs(_logspace(-30, 0, N // 8))],
        "cos": [lin(-100.0, 100.0, N), _both_signs(_logspace(-30, 0, N // 8))],
    }[op]
    specials = [v for v in SPECIALS if not v > 0] if op == "expneg" else SPECIALS  # x <= 0
    return np.concatenate([*sweeps, specials]).astype(dtype)


def errors(got: np.ndarray, ref: np.ndarray, tiny: float) -> tuple[float, float]:
    """(max relative error where |ref| >= tiny, max absolute error) over finite refs."""
    got = got.astype(np.float64)
    finite = np.isfinite(ref)
    diff = np.abs(got[finite] - ref[finite])
    big = np.abs(ref[finite]) >= tiny
    rel = float(np.max(diff[big] / np.abs(ref[finite][big]), initial=0.0))
    return rel, float(np.max(diff, initial=0.0))


def check_specials(got: np.ndarray, ref: np.ndarray) -> None:
    """NaN where the reference is NaN, and exactly the reference's infinities."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    inf = np.isinf(ref)
    np.testing.assert_array_equal(got[inf], ref[inf])
    assert not np.isinf(got[~inf]).any()


@functools.cache
def _case(op: str, dtype_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, float64 reference) of one op's sweep, shared by the scalar and vector runs."""
    x = inputs(op, np.dtype(dtype_name).type)
    with np.errstate(all="ignore"):
        return x, REF[op](x.astype(np.float64))


# --------------------------------------------------------------------------------------
# Accuracy over dense sweeps.
# --------------------------------------------------------------------------------------

# op: (max relative error where |ref| >= FLT_MIN, max absolute error); None = not asserted.
# Measured maxima are in docs/mathfn.md; these bounds give ~1.5x headroom.
F32_BOUNDS = {
    "exp": (1.1e-7, None),
    "expneg": (1.1e-7, None),
    "expm1": (1.8e-7, None),
    "log": (1.2e-7, None),
    "log1p": (2.0e-7, None),
    "tanh": (2.5e-7, None),
    "sigmoid": (2.6e-7, None),
    "softplus": (2.5e-7, None),
    "erf": (2.0e-7, 1.5e-7),
    "sin": (None, 1.0e-7),
    "cos": (None, 1.0e-7),
}
F64_BOUNDS = {
    "exp": (4e-16, None),
    "expneg": (4e-16, None),
    "expm1": (4e-16, None),
    "log": (4e-16, None),
    "log1p": (4e-16, None),
    "tanh": (7e-16, None),
    "sigmoid": (5e-16, None),
    "softplus": (7e-16, None),
    "erf": (4e-16, 4e-16),
    "sin": (None, 2.5e-16),
    "cos": (None, 2.5e-16),
}


def _check_sweep(jit: _Jit, op: str, bounds) -> None:
    x, ref = _case(op, np.dtype(jit.dtype).name)
    got = jit(op, x)
    check_specials(got, ref)
    tiny = F32_TINY if jit.dtype == np.float32 else F64_TINY
    rel, ab = errors(got, ref, tiny)
    max_rel, max_abs = bounds[op]
    if max_rel is not None:
        assert rel <= max_rel, f"{op}: max relative error {rel:.3e} > {max_rel:.1e}"
    if max_abs is not None:
        assert ab <= max_abs, f"{op}: max absolute error {ab:.3e} > {max_abs:.1e}"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("variant", ["f32x1", "f32x16"])
def test_float_accuracy(jits, variant, op):
    _check_sweep(jits[variant], op, F32_BOUNDS)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("variant", ["f64x1", "f64x8"])
def test_double_accuracy(jits, variant, op):
    _check_sweep(jits[variant], op, F64_BOUNDS)


# --------------------------------------------------------------------------------------
# Special values, subnormals, wide ranges.
# --------------------------------------------------------------------------------------

INF, NAN = np.inf, np.nan
# op: [(x, exact expected result)], checked bit-for-bit (so the sign of zero counts).
EXACT = {
    "exp": [(-INF, 0.0), (INF, INF), (1000.0, INF), (-1000.0, 0.0), (0.0, 1.0), (-0.0, 1.0)],
    "expm1": [
        (-INF, -1.0),
        (INF, INF),
        (1000.0, INF),
        (-0.0, -0.0),
        (0.0, 0.0),
        (-100.0, -1.0),
        (1e-30, 1e-30),
    ],
    "log": [
        (0.0, -INF),
        (-0.0, -INF),
        (INF, INF),
        (1.0, 0.0),
        (-1.0, NAN),
        (-INF, NAN),
        (-1e-45, NAN),
    ],
    "log1p": [
        (-1.0, -INF),
        (INF, INF),
        (-2.0, NAN),
        (-INF, NAN),
        (-0.0, -0.0),
        (0.0, 0.0),
        (1e-30, 1e-30),
    ],
    "tanh": [
        (INF, 1.0),
        (-INF, -1.0),
        (20.0, 1.0),
        (-20.0, -1.0),
        (0.0, 0.0),
        (-0.0, -0.0),
        (1e-30, 1e-30),
        (-1e-30, -1e-30),
    ],
    "expneg": [(-INF, 0.0), (0.0, 1.0), (-0.0, 1.0), (-1000.0, 0.0)],
    "sigmoid": [(-INF, 0.0), (INF, 1.0), (0.0, 0.5), (-1000.0, 0.0), (100.0, 1.0)],
    "softplus": [(-INF, 0.0), (INF, INF), (1e30, 1e30), (-1000.0, 0.0), (100.0, 100.0)],
    "erf": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (10.0, 1.0), (-10.0, -1.0)],
    "sin": [(INF, NAN), (-INF, NAN), (0.0, 0.0), (-0.0, -0.0), (1e-30, 1e-30)],
    "cos": [(INF, NAN), (-INF, NAN), (0.0, 1.0), (-0.0, 1.0), (1e-30, 1.0)],
}


# Overflow and underflow thresholds of each format.
EXACT_BY_FORMAT = {
    "f32x16": {
        "exp": [(88.73, INF), (89.0, INF), (-103.98, 0.0), (-104.0, 0.0)],
        "expm1": [(88.73, INF), (89.0, INF)],
        "expneg": [(-87.7, 0.0), (-104.0, 0.0)],  # subnormal results from -87.68: 0
    },
    "f64x8": {
        "exp": [(709.79, INF), (710.0, INF), (-745.14, 0.0), (-746.0, 0.0)],
        "expm1": [(709.79, INF), (710.0, INF)],
        "expneg": [(-709.2, 0.0), (-746.0, 0.0)],
    },
}


@pytest.mark.parametrize("variant", ["f32x16", "f64x8"])
@pytest.mark.parametrize("op", OPS)
def test_exact_special_values(jits, variant, op):
    jit = jits[variant]
    cases = EXACT[op] + EXACT_BY_FORMAT[variant].get(op, [])
    x, want = (np.array(v, dtype=jit.dtype) for v in zip(*cases, strict=True))
    x = np.append(x, NAN)  # NaN propagates everywhere
    want = np.append(want, NAN)
    got = jit(op, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{op}({x})")
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok], err_msg=f"{op}({x[ok]})")
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


def _subnormals(n: int) -> np.ndarray:
    return np.linspace(1, 0x007FFFFF, n).astype(np.uint32).view(np.float32)


def test_float_exp_gradual_underflow(jits):
    """exp into the subnormal range is rounded once: within 1 ulp of the float32-rounded
    reference (the final rounding plus the polynomial's last-ulp error)."""
    x = np.linspace(-103.9, -87.3, 1 << 18).astype(np.float32)
    got = jits["f32x16"]("exp", x)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps.max() <= 1
    assert (got > 0).all() or (got >= 0).all()


def test_float_exp_within_one_ulp(jits):
    """Every 16th float of [-87.3, 88.7] (about 10^7 inputs): float32 exp is at most 1 ulp
    from the correctly rounded result, and correctly rounded for more than 99% of them."""
    lo, hi = (np.float32(v).view(np.uint32) for v in (87.3, 88.7))
    x = np.concatenate(
        [
            np.arange(0, hi, 16, dtype=np.uint32).view(np.float32),
            -np.arange(0, lo, 16, dtype=np.uint32).view(np.float32),
        ]
    )
    got = jits["f32x16"]("exp", x)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps.max() <= 1
    assert np.mean(ulps > 0) < 0.01


def test_float_expneg_within_one_ulp_and_zero_only_below_the_normal_range(jits):
    """Every 16th float of [ln FLT_MIN, 0]: at most 1 ulp from the correctly rounded
    result. Below it, where e^x is subnormal, within 1 ulp or 0, and 0 from -87.7."""
    lo = np.float32(87.3365).view(np.uint32)  # ln FLT_MIN = -87.33654
    x = -np.arange(0, lo, 16, dtype=np.uint32).view(np.float32)
    got = jits["f32x16"]("expneg", x)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps.max() <= 1
    below = np.linspace(-110.0, -87.337, 1 << 16).astype(np.float32)
    got = jits["f32x16"]("expneg", below)
    want = np.exp(below.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ((ulps <= 1) | (got == 0)).all()
    assert (got[below < -87.7] == 0).all()
    assert (want < np.finfo(np.float32).tiny).all()


@pytest.mark.parametrize("op", ["exp", "expneg"])
@pytest.mark.parametrize("variant", ["f32x16", "f64x8"])
def test_exp_of_any_nan_is_nan(jits, variant, op):
    """exp has no NaN select: NaN must survive its integer exponent arithmetic for every
    payload, quiet or signalling, of either sign."""
    jit = jits[variant]
    uint = np.uint32 if jit.dtype == np.float32 else np.uint64
    bits = 23 if jit.dtype == np.float32 else 52
    exp_mask = uint(((1 << (64 if bits == 52 else 32)) - 1) ^ ((1 << bits) - 1))
    payload = np.random.default_rng(9).integers(1, 1 << bits, 4096, dtype=np.uint64)
    payload[:4] = [1, (1 << bits) - 1, 1 << (bits - 1), 0x1FF]
    x = (payload.astype(uint) | exp_mask).view(jit.dtype)  # both signs via the top bit
    x[::2] = -x[::2]
    assert np.isnan(x).all()
    assert np.isnan(jit(op, x)).all()


def test_float_exp_is_short():
    """The float exp is straight-line code of 18 operations (on AVX-512, 18 instructions:
    bitcasts are free and each compare + select is one min/max) with no float->int
    conversion: the exponent comes from the magic-number sum."""
    mod = ir.Module(name="exp_shape")
    ty = ir.VectorType(F32, 16)
    fn = ir.Function(mod, ir.FunctionType(ty, [ty]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(emit_math(b, "exp", fn.args[0]))
    free = ("bitcast", "fcmp", "icmp", "ret")
    ops = [i.opname for i in fn.blocks[0].instructions if i.opname not in free]
    assert "fptosi" not in ops and "fptoui" not in ops
    assert len(ops) <= 18, ops


def test_float_expneg_is_shorter():
    """Without the upper clamp and the subnormal scaling, 13 operations (the clamp's
    compare + select is one max)."""
    mod = ir.Module(name="expneg_shape")
    ty = ir.VectorType(F32, 8)
    fn = ir.Function(mod, ir.FunctionType(ty, [ty]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(emit_math(b, "expneg", fn.args[0]))
    free = ("bitcast", "fcmp", "ret")
    ops = [i.opname for i in fn.blocks[0].instructions if i.opname not in free]
    assert len(ops) <= 13, ops


def test_float_log_of_subnormals(jits):
    x = _subnormals(1 << 18)
    got = jits["f32x16"]("log", x)
    ref = np.log(x.astype(np.float64))
    assert np.max(np.abs(got - ref) / np.abs(ref)) <= 1e-7


def test_double_log_of_subnormals(jits):
    x = np.linspace(1, 1 << 52, 1 << 16).astype(np.uint64).view(np.float64)
    got = jits["f64x8"]("log", x)
    assert np.max(np.abs(got - np.log(x)) / np.abs(np.log(x))) <= 4e-16


def test_float_sigmoid_softplus_far_negative(jits):
    """sigmoid and softplus ~ e^x for x << 0: correct where the result is subnormal too."""
    x = np.linspace(-103.0, -80.0, 1 << 16).astype(np.float32)
    want = np.exp(x.astype(np.float64))
    for op in ("sigmoid", "softplus"):
        got = jits["f32x16"](op, x).astype(np.float64)
        # relative where the result is normal, one subnormal ulp where it is not
        assert (np.abs(got - want) <= np.maximum(2.6e-7 * want, 1.5e-45)).all()


@pytest.mark.parametrize(("limit", "bound"), [(2e7, 1.5e-7), (1e9, 1e-5)])
def test_float_sin_cos_wide_range(jits, limit, bound):
    """The two-pass Cody-Waite reduction keeps ~1 ulp up to 2e7, then degrades as
    ~4e-15 |x| (pi/2's first part has 24 bits)."""
    x = np.random.default_rng(7).uniform(-limit, limit, 1 << 18).astype(np.float32)
    for op in ("sin", "cos"):
        got = jits["f32x16"](op, x)
        assert np.max(np.abs(got - REF[op](x.astype(np.float64)))) <= bound


@pytest.mark.parametrize("op", ["sin", "cos", "tanh", "sigmoid", "erf"])
def test_float_bounded_on_all_finite_inputs(jits, op):
    """Random bit patterns (every exponent): no overflow or garbage outside [-1, 1]."""
    bits = np.random.default_rng(3).integers(0, 1 << 32, 1 << 18, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)]
    got = jits["f32x16"](op, x)
    assert np.isfinite(got).all()
    assert (np.abs(got) <= 1.0).all()


def test_double_sin_cos_wide_range(jits):
    """In double the three-part pi/2 keeps ~1 ulp up to |x| ~ 1e16."""
    x = np.random.default_rng(8).uniform(-1e15, 1e15, 1 << 18)
    for op in ("sin", "cos"):
        got = jits["f64x8"](op, x)
        assert np.max(np.abs(got - REF[op](x))) <= 2.5e-16


# --------------------------------------------------------------------------------------
# Pow.
# --------------------------------------------------------------------------------------

POW_SPECIALS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    2.0,
    -2.0,
    0.5,
    -0.5,
    3.0,
    -3.0,
    2.5,
    -2.5,
    1e-3,
    1e30,
    -1e30,
    INF,
    -INF,
    NAN,
]


@pytest.mark.parametrize("variant", ["f32x1", "f32x16", "f64x8"])
def test_pow_special_values(jits, variant):
    """Every pair of special operands agrees with numpy's pow (C99 semantics), sign of zero
    and NaN included."""
    jit = jits[variant]
    a, b = np.meshgrid(np.array(POW_SPECIALS, jit.dtype), np.array(POW_SPECIALS, jit.dtype))
    a, b = a.ravel(), b.ravel()
    with np.errstate(all="ignore"):
        want = np.power(a, b)
    got = jit("pow", a, b)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{a}\n{b}")
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


@pytest.mark.parametrize(
    ("variant", "bound"), [("f32x1", 7e-8), ("f32x16", 7e-8), ("f64x8", 3e-14)]
)
def test_pow_accuracy(jits, variant, bound):
    """float pow runs in double: correctly rounded but for ties (<= 2^-24 relative);
    double pow's error grows with |b log a| (here |b log a| <= 92)."""
    jit = jits[variant]
    rng = np.random.default_rng(5)
    n = 1 << 20
    a = (10.0 ** rng.uniform(-5, 5, n)).astype(jit.dtype)
    b = rng.uniform(-8, 8, n).astype(jit.dtype)
    a[: n // 4] *= -1  # negative bases with integer exponents
    b[: n // 4] = np.round(b[: n // 4])
    ref = np.power(a.astype(np.float64), b.astype(np.float64))
    got = jit("pow", a, b)
    ok = np.isfinite(ref) & (np.abs(ref) > 1e-37) & (np.abs(ref) < 1e38)
    assert ok.sum() > n // 2
    assert np.max(np.abs(got[ok] - ref[ok]) / np.abs(ref[ok])) <= bound


def test_pow_common_exponents_exact(jits):
    a = np.random.default_rng(6).uniform(-100, 100, 4096).astype(np.float32)
    jit = jits["f32x16"]
    np.testing.assert_array_equal(jit("pow", a, np.full_like(a, 2.0)), a * a)
    np.testing.assert_array_equal(jit("pow", a, np.full_like(a, 1.0)), a)
    np.testing.assert_array_equal(jit("pow", a, np.zeros_like(a)), np.ones_like(a))
    assert jit("pow", np.float32([2.0]), np.float32([10.0]))[0] == 1024.0


# --------------------------------------------------------------------------------------
# Code shape: straight-line, vectorisable, no library calls.
# --------------------------------------------------------------------------------------

_CALL = re.compile(r"\bcall\b[^@]*@([\w.$]+)")
# Without FMA hardware llvm.fma becomes a libm call (correct, slow): nothing to check then.
needs_fma = pytest.mark.skipif(
    not llvm.get_host_cpu_features().get("fma", False), reason="host CPU has no FMA"
)


@pytest.mark.parametrize("op", [*OPS, "pow"])
@pytest.mark.parametrize("variant", ["f32x16", "f64x8"])
def test_vector_loop_calls_only_intrinsics(jits, variant, op):
    ir_text = str(jits[variant].mod.get_function(op))
    callees = set(_CALL.findall(ir_text))
    assert all(c.startswith("llvm.") for c in callees), callees


@needs_fma
@pytest.mark.parametrize("variant", ["f32x16", "f64x8"])
def test_machine_code_has_no_calls(jits, variant):
    asm = jits[variant].asm
    # calls, and jumps anywhere but to a local label (tail calls)
    calls = [ln for ln in asm.splitlines() if re.match(r"\s*(callq?\s|jmpq?\s+(?!\.L))", ln)]
    assert not calls, calls[:5]


@pytest.mark.parametrize("op", [*OPS, "pow"])
def test_scalar_loop_is_vectorised(jits, op):
    """A plain scalar loop around the op is vectorised by LLVM's loop vectoriser: the emitted
    code has no calls, branches or other vectorisation blockers."""
    ir_text = str(jits["f32x1"].mod.get_function(op))
    # any width: pow computes in double, 4 lanes with AVX2
    assert re.search(r"<\d+ x float>", ir_text), f"{op}: scalar loop not vectorised"


def test_straight_line_code_and_declaration_reuse():
    """Any vector width builds, no basic block is added, intrinsics are declared once per
    module under their overloaded name, and the result has the input's type."""
    mod = ir.Module(name="shape")
    for elem, lanes in [(F32, 1), (F32, 3), (F32, 16), (F64, 1), (F64, 5)]:
        ty = elem if lanes == 1 else ir.VectorType(elem, lanes)
        fn = ir.Function(mod, ir.FunctionType(ty, [ty, ty]), f"f_{elem}_{lanes}")
        b = ir.IRBuilder(fn.append_basic_block())
        acc = fn.args[0]
        for op in OPS:
            y = emit_math(b, op, acc)
            assert y.type == ty
            acc = b.fadd(acc, y)
        acc = b.fadd(acc, emit_pow(b, fn.args[0], fn.args[1]))
        b.ret(acc)
        assert len(fn.blocks) == 1
    names = [g.name for g in mod.global_values]
    assert len(names) == len(set(names))
    assert "llvm.fma.v16f32" in names and "llvm.fabs.f32" in names and "llvm.fma.v5f64" in names
    llvm.parse_assembly(str(mod)).verify()


def test_bad_arguments():
    mod = ir.Module()
    ty = ir.VectorType(F32, 4)
    fn = ir.Function(mod, ir.FunctionType(ty, [ty, ir.IntType(32), ir.VectorType(F64, 4)]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    x, i, d = fn.args
    with pytest.raises(ValueError, match="unknown op"):
        emit_math(b, "gamma", x)
    with pytest.raises(TypeError):
        emit_math(b, "exp", i)
    with pytest.raises(TypeError):
        emit_pow(b, x, d)
    assert {"exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "softplus"} <= MATH_OPS
