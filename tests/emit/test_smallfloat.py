"""Bit-exact tests of polyonnx.emit.smallfloat against ml_dtypes and onnx.reference.

Every function is emitted inside a tiny loop ``out[i] = f(in[i])``, scalar and on
``<16 x T>`` chunks, optimised at O3 for the host CPU and JIT-compiled.  Decoding is
checked on every raw pattern (256 or 65536) against ``ml_dtypes`` (``astype(float32)``;
any NaN for NaN).  Encoding is checked bit for bit against ``onnx.reference``'s ``Cast``
(``op_cast.cast_to``) over ~7.4e6 float32 values (all sign/exponent/11-bit-mantissa
prefixes with six tails, so every tie, every subnormal step and every overflow boundary of
every type, plus random patterns, the neighbourhood of every representable value, ±inf,
±0 and NaNs with payloads), every float16 pattern, float64 values, and integers.
"""

from __future__ import annotations

import ctypes
import functools

import llvmlite.binding as llvm
import ml_dtypes
import numpy as np
import onnx
import pytest
from llvmlite import ir
from onnx.reference.ops.op_cast import cast_to

from polyonnx.emit.smallfloat import ROUND_MODES, SMALL_DTYPES, emit_decode, emit_encode
from polyonnx.errors import CodegenError

F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
I8, I16, I32, I64 = (ir.IntType(w) for w in (8, 16, 32, 64))
LANES = (1, 16)
FLOATS = sorted(d for d, (_, kind) in SMALL_DTYPES.items() if kind == "float")
INTS = sorted(d for d, (_, kind) in SMALL_DTYPES.items() if kind == "int")
FLOAT8 = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}
E8M0 = "float8_e8m0fnu"

_NP = {
    F16: np.float16,
    F32: np.float32,
    F64: np.float64,
    I8: np.int8,
    I16: np.uint16,
    I32: np.int32,
    I64: np.int64,
}


def _raw_type(dtype: str) -> ir.IntType:
    return ir.IntType(SMALL_DTYPES[dtype][0])


def _raw_np(dtype: str):
    return np.uint8 if SMALL_DTYPES[dtype][0] == 8 else np.uint16


# --------------------------------------------------------------------------------------
# JIT harness (as in test_mathfn.py).
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


def _add_loop(mod: ir.Module, name: str, src: ir.Type, dst: ir.Type, lanes: int, body) -> None:
    """``void name(ptr in, ptr out, i64 n)``: out[i] = body(in[i]) on ``lanes``-wide
    chunks (n counts chunks)."""
    sty, dty = (t if lanes == 1 else ir.VectorType(t, lanes) for t in (src, dst))
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 2 + [I64]), name)
    inp, out, n = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(I64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    x = b.load(b.gep(inp, [i], source_etype=sty), typ=sty, align=_NP[src]().itemsize)
    b.store(body(b, x), b.gep(out, [i], source_etype=dty), align=_NP[dst]().itemsize)
    nxt = b.add(i, ir.Constant(I64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()


def _np_of(t: ir.Type):
    return np.uint8 if t == I8 else _NP[t]


class _Jit:
    """All decode/encode loops of this file in one module, for each of ``lanes_list``.

    ``speed=0`` leaves the IR as emitted (the scalar loops are not vectorised by LLVM)."""

    def __init__(self, lanes_list: tuple[int, ...] = LANES, speed: int = 3):
        tm = _target_machine()
        mod = ir.Module(name="smallfloat")
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        self.sig: dict[str, tuple[type, type, int]] = {}

        def add(name, src, dst, lanes, body):
            _add_loop(mod, name, src, dst, lanes, body)
            self.sig[name] = (_np_of(src), _np_of(dst), lanes)

        for lanes in lanes_list:
            for d in FLOATS:
                raw = _raw_type(d)
                add(f"dec_{d}_{lanes}", raw, F32, lanes, lambda b, x, d=d: emit_decode(b, x, d))
                for src in (F16, F32, F64):
                    for sat in (True, False):
                        modes = sorted(ROUND_MODES) if d == E8M0 else ["up"]
                        for mode in modes:
                            add(
                                f"enc_{d}_{src}_{sat}_{mode}_{lanes}",
                                src,
                                raw,
                                lanes,
                                lambda b, x, d=d, s=sat, m=mode: emit_encode(
                                    b, x, d, s, round_mode=m
                                ),
                            )
            for d in INTS:
                add(f"dec_{d}_{lanes}", I8, I8, lanes, lambda b, x, d=d: emit_decode(b, x, d))
                for src in (F16, F32, F64, I8, I32, I64):
                    add(
                        f"enc_{d}_{src}_{lanes}",
                        src,
                        I8,
                        lanes,
                        lambda b, x, d=d: emit_encode(b, x, d),
                    )
        self.ir_text = str(mod)
        self.mod = llvm.parse_assembly(self.ir_text)
        self.mod.verify()
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=speed))
        pb.getModulePassManager().run(self.mod, pb)
        self.ee = llvm.create_mcjit_compiler(self.mod, tm)
        self.ee.finalize_object()
        self._fns = {}

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        src, dst, lanes = self.sig[name]
        x = np.ascontiguousarray(x).ravel()
        assert x.dtype.itemsize == np.dtype(src).itemsize, (name, x.dtype)
        size = x.size
        padded = -(-size // lanes) * lanes
        inp = np.ascontiguousarray(np.resize(x, padded))
        out = np.empty(padded, dtype=dst)
        if name not in self._fns:
            proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
            self._fns[name] = proto(self.ee.get_function_address(name))
        self._fns[name](inp.ctypes.data, out.ctypes.data, padded // lanes)
        return out[:size]


@pytest.fixture(scope="module")
def jit() -> _Jit:
    return _Jit()


@pytest.fixture(scope="module")
def jit_o0() -> _Jit:
    return _Jit(lanes_list=(1,), speed=0)


# --------------------------------------------------------------------------------------
# References and inputs.
# --------------------------------------------------------------------------------------


def _np_dtype(dtype: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, dtype))


def _reference(x: np.ndarray, dtype: str, saturate: bool, round_mode: str = "up") -> np.ndarray:
    """onnx.reference's Cast of ``x`` to ``dtype``, as raw storage bits."""
    to = onnx.helper.np_dtype_to_tensor_dtype(_np_dtype(dtype))
    with np.errstate(invalid="ignore", over="ignore"):
        y = cast_to(x, to, saturate, round_mode)
    assert y.dtype == _np_dtype(dtype)
    return y.view(_raw_np(dtype) if SMALL_DTYPES[dtype][1] == "float" else np.uint8)


def _representable(dtype: str) -> np.ndarray:
    """Every finite float32 value of ``dtype``, with both signs."""
    with np.errstate(invalid="ignore"):
        v = np.arange(1 << SMALL_DTYPES[dtype][0], dtype=_raw_np(dtype))
        v = v.view(_np_dtype(dtype)).astype(np.float32)
    v = np.unique(np.abs(v[np.isfinite(v)]))
    return np.concatenate([v, -v])


def _neighbourhood(dtype: str) -> np.ndarray:
    """Each representable value, each midpoint between neighbours, and ±1, ±2 float32 ulps
    around them (the ties and the values just either side of them)."""
    v = np.unique(np.abs(_representable(dtype))).astype(np.float64)
    mids = (v[:-1] + v[1:]) / 2
    beyond = 2 * v[-1] - v[-2]  # the next value past the largest: its midpoint with max
    with np.errstate(over="ignore"):
        points = np.concatenate([v, mids, [(v[-1] + beyond) / 2, beyond, 2 * v[-1]]])
        points = points.astype(np.float32)
    bits = points.view(np.int32)[:, None] + np.arange(-2, 3, dtype=np.int32)[None, :]
    near = bits.ravel().view(np.float32)
    near = near[np.isfinite(near)]
    return np.concatenate([near, -near])


SPECIALS = np.array(
    [0x0, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0xFFC0_0000, 0x7F80_0001,
     0xFF80_0001, 0x7FFF_FFFF, 0xFFFF_FFFF, 0x7FA0_0000, 0x7F7F_FFFF, 0xFF7F_FFFF, 0x1, 0x8000_0001,
     0x0080_0000, 0x007F_FFFF],
    dtype=np.uint32,
).view(np.float32)  # fmt: skip


@functools.cache
def _f32_sweep() -> np.ndarray:
    """All 2^20 (sign, exponent, top 11 mantissa bits) prefixes x tails {0, 1, 0x7FF,
    0x800, 0x801, 0xFFF}, plus 2^20 random patterns and the special values."""
    top = np.arange(1 << 20, dtype=np.uint32) << 12
    tails = np.array([0, 1, 0x7FF, 0x800, 0x801, 0xFFF], dtype=np.uint32)
    structured = (top[:, None] | tails[None, :]).ravel()
    rand = np.random.default_rng(0).integers(0, 1 << 32, 1 << 20, dtype=np.uint32)
    return np.concatenate([structured, rand, SPECIALS.view(np.uint32)]).view(np.float32)


@functools.cache
def _f32_inputs(dtype: str) -> np.ndarray:
    return np.concatenate([_f32_sweep(), _neighbourhood(dtype)])


@functools.cache
def _f16_all() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


@functools.cache
def _f64_inputs(dtype: str) -> np.ndarray:
    """float64 values that round differently directly and through float32, the float32
    neighbourhood widened to float64 with tiny offsets, random doubles and specials."""
    near = _neighbourhood(dtype).astype(np.float64)
    tiny = np.array([0.0, 2.0**-40, -(2.0**-40)])
    wiggled = (near[:, None] * (1 + tiny[None, :])).ravel()
    rng = np.random.default_rng(1)
    rand = rng.integers(0, 1 << 64, 1 << 18, dtype=np.uint64).view(np.float64)
    scaled = rng.standard_normal(1 << 18) * np.exp2(rng.integers(-30, 30, 1 << 18))
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e300, 5e-324])
    return np.concatenate([wiggled, rand, scaled, specials])


def _assert_same_bits(got: np.ndarray, want: np.ndarray, x: np.ndarray, what: str) -> None:
    bad = np.nonzero(got != want)[0]
    if bad.size:
        show = ", ".join(
            f"{x[i]!r} (0x{x.view(f'u{x.dtype.itemsize}')[i]:x}): got 0x{got[i]:x} "
            f"want 0x{want[i]:x}"
            for i in bad[:8]
        )
        pytest.fail(f"{what}: {bad.size} of {x.size} differ, e.g. {show}")


# --------------------------------------------------------------------------------------
# Interface.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", sorted(SMALL_DTYPES))
def test_dtype_names_and_storage(dtype):
    np_dtype = _np_dtype(dtype)
    assert np_dtype.name == dtype
    assert np_dtype.itemsize * 8 == SMALL_DTYPES[dtype][0]
    onnx.helper.np_dtype_to_tensor_dtype(np_dtype)  # an ONNX element type


def test_every_onnx_narrow_type_is_covered():
    narrow = {
        "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
        "FLOAT8E8M0", "FLOAT4E2M1", "FLOAT6E2M3", "FLOAT6E3M2", "INT4", "UINT4", "INT2",
        "UINT2",
    }  # fmt: skip
    for name in narrow & set(onnx.TensorProto.DataType.keys()):
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(getattr(onnx.TensorProto, name))
        assert np_dtype.name in SMALL_DTYPES, name


def _straight_line(body, arg_type: ir.Type, ret_type: ir.Type) -> str:
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(ret_type, [arg_type]), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(body(b, fn.args[0]))
    assert len(fn.blocks) == 1
    text = str(mod)
    llvm.parse_assembly(text).verify()
    return text


@pytest.mark.parametrize("lanes", [1, 4, 16])
@pytest.mark.parametrize("dtype", sorted(SMALL_DTYPES))
def test_straight_line_code(dtype, lanes):
    """One basic block, no calls, no branches, no globals, valid IR, any lane count."""

    def vec(t):
        return t if lanes == 1 else ir.VectorType(t, lanes)

    raw = _raw_type(dtype)
    wide = F32 if SMALL_DTYPES[dtype][1] == "float" else I8
    texts = [_straight_line(lambda b, x: emit_decode(b, x, dtype), vec(raw), vec(wide))]
    for sat in (True, False):
        for mode in ROUND_MODES:
            texts.append(
                _straight_line(
                    lambda b, x, s=sat, m=mode: emit_encode(b, x, dtype, s, round_mode=m),
                    vec(wide),
                    vec(raw),
                )
            )
    for text in texts:
        body = text.split("{", 1)[1]
        assert " call " not in body and " br " not in body and "@" not in body


def test_errors():
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [I8, I16, F32, I32]), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    byte, half_word, flt, word = fn.args
    with pytest.raises(CodegenError, match="not a small storage dtype"):
        emit_decode(b, byte, "float16")
    with pytest.raises(CodegenError, match="not a small storage dtype"):
        emit_encode(b, flt, "float8_e4m3")
    with pytest.raises(CodegenError, match="needs i16"):
        emit_decode(b, byte, "bfloat16")
    with pytest.raises(CodegenError, match="needs i8"):
        emit_decode(b, half_word, "float8_e5m2")
    with pytest.raises(CodegenError, match="needs i8"):
        emit_decode(b, word, "int4")
    with pytest.raises(CodegenError, match="half/float/double"):
        emit_encode(b, word, "float8_e4m3fn")
    with pytest.raises(CodegenError, match="round_mode"):
        emit_encode(b, flt, E8M0, round_mode="zero")


# --------------------------------------------------------------------------------------
# Decode: every raw pattern.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_decode_float_every_pattern(jit, dtype, lanes):
    raw = np.arange(1 << SMALL_DTYPES[dtype][0], dtype=_raw_np(dtype))
    with np.errstate(invalid="ignore"):
        want = raw.view(_np_dtype(dtype)).astype(np.float32)
    got = jit(f"dec_{dtype}_{lanes}", raw)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=dtype)
    _assert_same_bits(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan], raw[~nan], dtype)


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("dtype", INTS)
def test_decode_int_every_pattern(jit, dtype, lanes):
    raw = np.arange(256, dtype=np.uint8)
    want = raw.view(_np_dtype(dtype)).astype(np.int8)
    got = jit(f"dec_{dtype}_{lanes}", raw).view(np.int8)
    np.testing.assert_array_equal(got, want, err_msg=dtype)


# --------------------------------------------------------------------------------------
# Encode: float kinds.
# --------------------------------------------------------------------------------------


def _modes(dtype: str) -> list[str]:
    return sorted(ROUND_MODES) if dtype == E8M0 else ["up"]


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dtype", FLOATS)
def test_encode_float32(jit, dtype, saturate, lanes):
    x = _f32_inputs(dtype)
    for mode in _modes(dtype):
        want = _reference(x, dtype, saturate, mode)
        got = jit(f"enc_{dtype}_{F32}_{saturate}_{mode}_{lanes}", x)
        _assert_same_bits(got, want, x, f"{dtype} saturate={saturate} round_mode={mode}")


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dtype", FLOATS)
def test_encode_float16_every_pattern(jit, dtype, saturate, lanes):
    x = _f16_all()
    for mode in _modes(dtype):
        want = _reference(x, dtype, saturate, mode)
        got = jit(f"enc_{dtype}_{F16}_{saturate}_{mode}_{lanes}", x)
        _assert_same_bits(got, want, x, f"{dtype} from f16 saturate={saturate} {mode}")


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dtype", FLOATS)
def test_encode_float64(jit, dtype, saturate, lanes):
    x = _f64_inputs(dtype)
    for mode in _modes(dtype):
        want = _reference(x, dtype, saturate, mode)
        got = jit(f"enc_{dtype}_{F64}_{saturate}_{mode}_{lanes}", x)
        _assert_same_bits(got, want, x, f"{dtype} from f64 saturate={saturate} {mode}")


def test_float64_rounds_once_like_the_reference(jit):
    """1 + 2^-8 + 2^-40 is above the bf16 tie. Rounding to float32 first would drop the
    2^-40 and take the tie to even (1.0); one rounding, as ml_dtypes 0.7 and so
    onnx.reference do, gives the next bf16 up, and so do we."""
    x = np.array([1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-8 + 2.0**-40), 1 + 2.0**-8])
    assert list(jit(f"enc_bfloat16_{F64}_True_up_1", x)) == [0x3F81, 0xBF81, 0x3F80]
    assert list(_reference(x, "bfloat16", True)) == [0x3F81, 0xBF81, 0x3F80]


@pytest.mark.parametrize("saturate", [True, False])
def test_encode_float8_onnx_table(jit, saturate):
    """The special rows of the ONNX Cast spec's float8 tables, where the reference agrees."""
    x = np.array([0.0, -0.0, np.nan, 1e6, -1e6], dtype=np.float32)
    rows = {  # type: (saturate=True codes, saturate=False codes)
        "float8_e4m3fn": ([0x00, 0x80, 0x7F, 0x7E, 0xFE], [0x00, 0x80, 0x7F, 0x7F, 0xFF]),
        "float8_e4m3fnuz": ([0x00, 0x00, 0x80, 0x7F, 0xFF], [0x00, 0x00, 0x80, 0x80, 0x80]),
        "float8_e5m2": ([0x00, 0x80, 0x7E, 0x7B, 0xFB], [0x00, 0x80, 0x7E, 0x7C, 0xFC]),
        "float8_e5m2fnuz": ([0x00, 0x00, 0x80, 0x7F, 0xFF], [0x00, 0x00, 0x80, 0x80, 0x80]),
    }
    for dtype, codes in rows.items():
        got = jit(f"enc_{dtype}_{F32}_{saturate}_up_1", x)
        np.testing.assert_array_equal(got, codes[0 if saturate else 1], err_msg=dtype)


# --------------------------------------------------------------------------------------
# Encode: int kinds.
# --------------------------------------------------------------------------------------


@functools.cache
def _int_inputs(np_type) -> np.ndarray:
    info = np.iinfo(np_type)
    dense = np.arange(max(info.min, -70000), min(info.max, 70000) + 1, dtype=np.int64)
    edges = np.array([info.min, info.min + 1, info.max - 1, info.max], dtype=np.int64)
    rand = np.random.default_rng(2).integers(info.min, info.max, 1 << 16, dtype=np.int64)
    return np.concatenate([dense, edges, rand]).astype(np_type)


@functools.cache
def _float_int_inputs(np_type) -> np.ndarray:
    if np_type is np.float16:
        return _f16_all()
    quarter = np.arange(-4000, 4000) / 4
    edges = np.array([2.0**31, -(2.0**31), 2.0**31 - 1, -(2.0**31) + 1, 2.0**30 + 3])
    near = (edges[:, None] + np.arange(-40, 41)[None, :] / 4).ravel()
    if np_type is np.float32:
        near = (np.float32(2.0**31).view(np.int32) + np.arange(-300, 300)).view(np.float32)
        near = np.concatenate([near, -near])
    if np_type is np.float32:
        return np.concatenate([_f32_sweep(), quarter.astype(np.float32), near.astype(np.float32)])
    return np.concatenate([quarter, near, _f64_inputs("int4")])


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("src", [F16, F32, F64, I8, I32, I64], ids=str)
@pytest.mark.parametrize("dtype", INTS)
def test_encode_int(jit, dtype, src, lanes):
    floats = src in (F16, F32, F64)
    x = _float_int_inputs(_NP[src]) if floats else _int_inputs(_NP[src])
    want = _reference(x, dtype, True)
    got = jit(f"enc_{dtype}_{src}_{lanes}", x)
    _assert_same_bits(got, want, x, f"{dtype} from {src}")


def test_encode_int_conformance_values(jit):
    """ONNX's backend test for Cast FLOAT -> INT4/UINT4/INT2/UINT2: a float outside the
    type's range is undefined in ONNX; like ml_dtypes 0.7 (the reference's) we give 0."""
    x = np.arange(-9, 16, dtype=np.float32)
    assert list(jit("enc_int4_float_1", x)[:3]) == [0, 8, 9]  # -9 -> 0, -8, -7
    assert list(jit("enc_uint4_float_1", x)[-2:]) == [14, 15]
    assert list(jit("enc_uint4_float_1", x)[:9]) == [0] * 9
    assert list(jit("enc_int2_float_1", np.arange(-3, 4, dtype=np.float32))) == [
        0, 2, 3, 0, 1, 0, 0,
    ]  # fmt: skip
    got = jit("enc_int4_float_1", np.array([7.5, -7.5, 8.0, -8.5, np.nan], dtype=np.float32))
    assert list(got) == [7, 9, 0, 8, 0]  # trunc toward zero, then 0 outside; NaN -> 0


# --------------------------------------------------------------------------------------
# The scalar code as emitted (O0: LLVM's loop vectoriser does not widen it first).
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", sorted(SMALL_DTYPES))
def test_unoptimised_scalar(jit_o0, dtype):
    raw = np.arange(1 << SMALL_DTYPES[dtype][0], dtype=_raw_np(dtype))
    if SMALL_DTYPES[dtype][1] == "int":
        want = raw.view(_np_dtype(dtype)).astype(np.int8)
        np.testing.assert_array_equal(jit_o0(f"dec_{dtype}_1", raw).view(np.int8), want)
        x = np.concatenate([np.arange(-300, 300) / 4, [np.nan, np.inf, 3e9, -3e9]])
        x = x.astype(np.float32)
        _assert_same_bits(jit_o0(f"enc_{dtype}_{F32}_1", x), _reference(x, dtype, True), x, dtype)
        return
    with np.errstate(invalid="ignore"):
        want = raw.view(_np_dtype(dtype)).astype(np.float32)
    got = jit_o0(f"dec_{dtype}_1", raw)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    _assert_same_bits(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan], raw[~nan], dtype)
    x = np.concatenate([_neighbourhood(dtype), SPECIALS])
    for saturate in (True, False):
        for mode in _modes(dtype):
            got = jit_o0(f"enc_{dtype}_{F32}_{saturate}_{mode}_1", x)
            _assert_same_bits(got, _reference(x, dtype, saturate, mode), x, dtype)
