"""The meaning of each krnl scalar op in LLVM IR, for scalars and vectors alike.

Floats carry only the ``contract`` fast-math flag (FMA formation): no reassociation, since
SIMD reductions are emitted explicitly and reordering multiplies can overflow where numpy
does not; IEEE NaN/inf semantics are kept: max/min propagate NaN as numpy does
(:func:`_propagating`: one vmaxps/vminps and a NaN fix-up, where ``llvm.maximum`` takes six
instructions on x86).
"""

from __future__ import annotations

from llvmlite import ir

from polyonnx.emit import mathfn, smallfloat
from polyonnx.emit.llvmtypes import I1, call_overloaded, constant, lanes_of, value_type
from polyonnx.emit.smallfloat import SMALL_DTYPES
from polyonnx.errors import CodegenError
from polyonnx.krnl.ir import is_float, is_unsigned, register_dtype

FAST = ("contract",)  # FMA contraction; no reassociation (SIMD reductions are explicit)

_FCMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _fast(inst: ir.Instruction) -> ir.Instruction:
    inst.flags.extend(FAST)
    return inst


def unary(b: ir.IRBuilder, op: str, x: ir.Value, dtype: str, out_dtype: str) -> ir.Value:
    dtype = register_dtype(dtype)
    lanes = lanes_of(x)
    if is_float(dtype):
        return _float_unary(b, op, x, dtype, lanes)
    if dtype == "bool":
        if op == "not":
            return b.xor(x, constant("bool", True, lanes))
        raise CodegenError(f"op {op} is not defined on bool")
    return _int_unary(b, op, x, dtype, lanes)


def _float_unary(b: ir.IRBuilder, op: str, x: ir.Value, dtype: str, lanes: int) -> ir.Value:
    zero, one = constant(dtype, 0.0, lanes), constant(dtype, 1.0, lanes)
    if op == "neg":
        return b.fneg(x)
    if op in ("abs", "sqrt", "floor", "ceil"):
        return call_overloaded(b, {"abs": "fabs"}.get(op, op), [x])
    if op == "round":
        return call_overloaded(b, "roundeven", [x])
    if op == "reciprocal":
        return b.fdiv(one, x)
    if op == "sign":
        pos = b.select(b.fcmp_ordered(">", x, zero), one, zero)
        neg = b.select(b.fcmp_ordered("<", x, zero), constant(dtype, -1.0, lanes), pos)
        return b.select(b.fcmp_unordered("uno", x, x), x, neg)
    if op == "isnan":
        return b.fcmp_unordered("uno", x, x)
    if op in ("isinf", "isposinf", "isneginf"):
        inf = constant(dtype, float("inf"), lanes)
        if op == "isposinf":
            return b.fcmp_ordered("==", x, inf)
        if op == "isneginf":
            return b.fcmp_ordered("==", x, b.fneg(inf))
        return b.fcmp_ordered("==", call_overloaded(b, "fabs", [x]), inf)
    if op in mathfn.MATH_OPS:
        if dtype == "float16":  # no half polynomials: compute in float32, round once
            wide = mathfn.emit_math(b, op, cast(b, x, "float16", "float32"))
            return cast(b, wide, "float32", "float16")
        return mathfn.emit_math(b, op, x)
    raise CodegenError(f"unary op {op} is not defined on {dtype}")


def _int_unary(b: ir.IRBuilder, op: str, x: ir.Value, dtype: str, lanes: int) -> ir.Value:
    zero = constant(dtype, 0, lanes)
    if op == "neg":
        return b.sub(zero, x)
    if op == "abs":
        return x if is_unsigned(dtype) else b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
    if op == "sign":
        one, minus = constant(dtype, 1, lanes), constant(dtype, -1, lanes)
        pos = b.select(b.icmp_signed("!=", x, zero), one, zero)
        return pos if is_unsigned(dtype) else b.select(b.icmp_signed("<", x, zero), minus, pos)
    if op in ("floor", "ceil", "round"):
        return x
    if op == "not":
        return b.xor(x, constant(dtype, -1, lanes))
    if op in ("isnan", "isinf", "isposinf", "isneginf"):
        return constant("bool", False, lanes)
    raise CodegenError(f"unary op {op} is not defined on {dtype}")


def binary(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    dtype = register_dtype(dtype)
    if op in _FCMP:
        return compare(b, op, x, y, dtype)
    if is_float(dtype):
        return _float_binary(b, op, x, y, dtype)
    if dtype == "bool":
        return _bool_binary(b, op, x, y)
    return _int_binary(b, op, x, y, dtype)


def compare(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    dtype = register_dtype(dtype)
    sym = _FCMP[op]
    if is_float(dtype):
        return b.fcmp_unordered(sym, x, y) if op == "ne" else b.fcmp_ordered(sym, x, y)
    if is_unsigned(dtype):
        return b.icmp_unsigned(sym, x, y)
    return b.icmp_signed(sym, x, y)


def _float_binary(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    if op in ("add", "sub", "mul", "div"):
        fn = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[op]
        return _fast(fn(x, y))
    if op in ("max", "min"):
        return _propagating(b, ">" if op == "max" else "<", x, y)
    if op == "fmod":
        return b.frem(x, y)
    if op == "mod":  # the result takes the divisor's sign, as Python's % does
        rem = b.frem(x, y)
        zero = constant(dtype, 0.0, lanes_of(x))
        differ = b.xor(b.fcmp_ordered("<", rem, zero), b.fcmp_ordered("<", y, zero))
        fix = b.and_(b.fcmp_ordered("!=", rem, zero), differ)
        return b.select(fix, _fast(b.fadd(rem, y)), rem)
    if op == "pow":
        if dtype == "float16":
            wide = mathfn.emit_pow(b, cast(b, x, dtype, "float32"), cast(b, y, dtype, "float32"))
            return cast(b, wide, "float32", dtype)
        return mathfn.emit_pow(b, x, y)
    raise CodegenError(f"binary op {op} is not defined on {dtype}")


def _propagating(b: ir.IRBuilder, sym: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """max (``sym`` ``>``) or min (``<``) that returns NaN when either operand is NaN:
    ``x > y ? x : y`` is one vmaxps (which gives y when either is NaN), then x where x is
    NaN. A reduction ``acc = max(acc, x)`` keeps a NaN once it has one. Of +0 and -0 it
    gives y (llvm.maximum would give +0; numpy gives x when they compare equal)."""
    pick = b.select(b.fcmp_ordered(sym, x, y), x, y)
    return b.select(b.fcmp_unordered("uno", x, x), x, pick)


def extremum(b: ir.IRBuilder, op: str, values: list[ir.Value], dtype: str) -> ir.Value:
    """max or min of several values (a pool's window), NaN when any of them is NaN.

    Folded pairwise, each NaN-propagating step is 4 instructions (compare, unordered
    compare, mask or, blend). Here the values go through a tree of plain compare-selects
    (one vmaxps each), and one unordered compare checks two values for NaN at a time:
    a 3x3 window takes 8 + 5 + 4 + 1 instructions instead of 32."""
    dtype = register_dtype(dtype)
    if not is_float(dtype) or len(values) < 3:
        result = values[0]
        for value in values[1:]:
            result = binary(b, op, result, value, dtype)
        return result
    sym = ">" if op == "max" else "<"
    level = list(values)
    while len(level) > 1:
        pairs = zip(level[::2], level[1::2], strict=False)
        picked = [b.select(b.fcmp_ordered(sym, x, y), x, y) for x, y in pairs]
        level = picked + level[len(picked) * 2 :]
    last = len(values) - 1
    nan = None
    for x, y in [(values[i], values[min(i + 1, last)]) for i in range(0, len(values), 2)]:
        found = b.fcmp_unordered("uno", x, y)
        nan = found if nan is None else b.or_(nan, found)
    return b.select(nan, constant(dtype, float("nan"), lanes_of(values[0])), level[0])


def _bool_binary(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    ors, ands = ("or", "bitor", "max", "add"), ("and", "bitand", "min", "mul")
    xors = ("xor", "bitxor")
    fn = b.or_ if op in ors else b.and_ if op in ands else b.xor if op in xors else None
    if fn is None:
        raise CodegenError(f"binary op {op} is not defined on bool")
    return fn(x, y)


def _int_binary(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    unsigned = is_unsigned(dtype)
    simple = {"add": b.add, "sub": b.sub, "mul": b.mul, "bitand": b.and_, "bitor": b.or_,
              "bitxor": b.xor, "and": b.and_, "or": b.or_, "xor": b.xor}  # fmt: skip
    if op in simple:
        return simple[op](x, y)
    if op in ("shl", "shr"):
        return _shift(b, op, x, y, dtype)
    if op in ("max", "min"):
        prefix = "u" if unsigned else "s"
        return call_overloaded(b, f"{prefix}{op}", [x, y])
    if op == "div":
        return _safe_div(b, x, y, dtype, b.udiv if unsigned else b.sdiv)
    if op == "fmod":
        return _safe_div(b, x, y, dtype, b.urem if unsigned else b.srem)
    if op == "mod":
        rem = _safe_div(b, x, y, dtype, b.urem if unsigned else b.srem)
        if unsigned:
            return rem
        zero = constant(dtype, 0, lanes_of(x))
        fix = b.and_(
            b.icmp_signed("!=", rem, zero),
            b.xor(b.icmp_signed("<", rem, zero), b.icmp_signed("<", y, zero)),
        )
        return b.select(fix, b.add(rem, y), rem)
    raise CodegenError(f"binary op {op} is not defined on {dtype}")


def _shift(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    """Shifts by any amount: a count outside [0, bits) shifts everything out (0, or the
    sign for an arithmetic right shift), where LLVM would give poison."""
    lanes = lanes_of(x)
    bits = constant(dtype, int(dtype.lstrip("uint")) if dtype != "bool" else 1, lanes)
    out = b.icmp_unsigned(">=", y, bits)
    count = b.select(out, constant(dtype, 0, lanes), y)
    if op == "shl":
        return b.select(out, constant(dtype, 0, lanes), b.shl(x, count))
    if is_unsigned(dtype):
        return b.select(out, constant(dtype, 0, lanes), b.lshr(x, count))
    sign = b.ashr(x, b.sub(bits, constant(dtype, 1, lanes)))
    return b.select(out, sign, b.ashr(x, count))


def _safe_div(b: ir.IRBuilder, x: ir.Value, y: ir.Value, dtype: str, fn) -> ir.Value:
    """Integer division (``fn``: sdiv, srem, udiv, urem) that cannot trap, as x86's idiv
    does on a zero divisor and on MIN / -1: those divide by 1 instead. A zero divisor
    gives 0; MIN / -1 gives MIN (two's complement wrap, as numpy) and MIN % -1 gives 0.
    Lowerings report a zero divisor a user gives (krnl/ir.py's Checked)."""
    lanes = lanes_of(x)
    zero = constant(dtype, 0, lanes)
    is_zero = b.icmp_signed("==", y, zero)
    trap = is_zero
    if not is_unsigned(dtype):
        bits = x.type.element.width if lanes > 1 else x.type.width
        least = constant(dtype, -(2 ** (bits - 1)), lanes)
        wraps = b.and_(
            b.icmp_signed("==", x, least), b.icmp_signed("==", y, constant(dtype, -1, lanes))
        )
        trap = b.or_(is_zero, wraps)
    safe = b.select(trap, constant(dtype, 1, lanes), y)
    return b.select(is_zero, zero, fn(x, safe))


def combine(b: ir.IRBuilder, op: str, acc: ir.Value, x: ir.Value, dtype: str) -> ir.Value:
    """One step of a reduction with operator ``op`` (add, mul, max, min, max_nnan)."""
    if op == "max_nnan":
        if is_float(register_dtype(dtype)):
            return b.select(b.fcmp_ordered(">", acc, x), acc, x)
        op = "max"
    return binary(b, op, acc, x, dtype)


def reduce_lanes(b: ir.IRBuilder, op: str, vec: ir.Value, dtype: str) -> ir.Value:
    """Reduce the lanes of ``vec`` with ``op`` by halving shuffles."""
    return b.extract_element(fold_lanes(b, op, vec, 1, dtype), ir.Constant(ir.IntType(32), 0))


def fold_lanes(b: ir.IRBuilder, op: str, vec: ir.Value, width: int, dtype: str) -> ir.Value:
    """``vec`` (a power-of-two multiple of ``width`` lanes) folded down to ``width`` lanes
    with ``op``, halving each step: lane ``i`` of the result combines every lane ``i`` mod
    ``width``."""
    count = vec.type.count
    while count > width:
        half = count // 2
        undef = ir.Constant(vec.type, ir.Undefined)
        hi = b.shuffle_vector(vec, undef, _lane_list(range(half, count)))
        lo = b.shuffle_vector(vec, undef, _lane_list(range(half)))
        vec = combine(b, op, lo, hi, dtype)
        count = half
    return vec


def _lane_list(lanes: range) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), list(lanes))


def cast(b: ir.IRBuilder, x: ir.Value, src: str, dst: str, saturate: bool = True) -> ir.Value:
    """Convert between register values. A cast to a small storage type (bfloat16, float8…)
    rounds to that type here (encode then decode), so the value is exact before a store."""
    if dst in SMALL_DTYPES:
        # a float for an int type goes to the encoder as it is: it truncates and wraps
        # (-3.0 -> uint2 1); through a uint8 register, fptoui of a negative value is
        # poison (0 on AVX2, the wrapped value with AVX-512's vcvttps2udq)
        keep = is_float(register_dtype(src)) and not is_float(register_dtype(dst))
        wide = x if keep else cast(b, x, src, register_dtype(dst))
        return smallfloat.emit_decode(b, smallfloat.emit_encode(b, wide, dst, saturate), dst)
    src = register_dtype(src)
    if src == dst:
        return x
    lanes = lanes_of(x)
    to = value_type(dst, lanes)
    if dst == "bool":
        if is_float(src):
            return b.fcmp_unordered("!=", x, constant(src, 0.0, lanes))
        return b.icmp_unsigned("!=", x, constant(src, 0, lanes))
    if src == "bool":
        return b.uitofp(x, to) if is_float(dst) else b.zext(x, to)
    if is_float(src) and is_float(dst):
        if src == "float16" and dst == "float64":  # exact either way
            return cast(b, cast(b, x, src, "float32"), "float32", dst)
        if src == "float64" and dst == "float16":
            # via float32 (the direct conversion is a compiler-rt call the JIT cannot
            # link), rounded to odd there so the second rounding is the only one
            return b.fptrunc(smallfloat.float32_odd(b, x), to)
        bits = {"float16": 16, "float32": 32, "float64": 64}
        return b.fpext(x, to) if bits[dst] > bits[src] else b.fptrunc(x, to)
    if is_float(src):
        return b.fptoui(x, to) if is_unsigned(dst) else b.fptosi(x, to)
    if is_float(dst):
        return b.uitofp(x, to) if is_unsigned(src) else b.sitofp(x, to)
    src_bits, dst_bits = (
        x.type.element.width if lanes > 1 else x.type.width,
        to.element.width if lanes > 1 else to.width,
    )
    if dst_bits < src_bits:
        return b.trunc(x, to)
    if dst_bits > src_bits:
        return b.zext(x, to) if is_unsigned(src) else b.sext(x, to)
    return x


__all__ = ["I1", "binary", "cast", "combine", "compare", "unary"]
