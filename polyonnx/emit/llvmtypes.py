"""dtype ↔ LLVM types, constants, splats and intrinsic declarations."""

from __future__ import annotations

from llvmlite import ir

from polyonnx.emit.smallfloat import SMALL_DTYPES
from polyonnx.krnl.ir import register_dtype

I1, I8, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)
PTR = ir.PointerType()

_SCALAR = {
    "float16": ir.HalfType(), "float32": ir.FloatType(), "float64": ir.DoubleType(),
    "int8": ir.IntType(8), "uint8": ir.IntType(8), "int16": ir.IntType(16),
    "uint16": ir.IntType(16), "int32": ir.IntType(32), "uint32": ir.IntType(32),
    "int64": ir.IntType(64), "uint64": ir.IntType(64), "bool": I1,
}  # fmt: skip


def value_type(dtype: str, lanes: int = 1) -> ir.Type:
    """The register type of a ``dtype`` value (bool is i1, bfloat16/float8… float32), as a
    vector when lanes > 1."""
    scalar = _SCALAR[register_dtype(dtype)]
    return scalar if lanes == 1 else ir.VectorType(scalar, lanes)


def memory_type(dtype: str, lanes: int = 1) -> ir.Type:
    """The in-memory type (bool is a byte, as in numpy; small types are their raw bits)."""
    if dtype in SMALL_DTYPES:
        scalar = ir.IntType(SMALL_DTYPES[dtype][0])
    else:
        scalar = I8 if dtype == "bool" else _SCALAR[dtype]
    return scalar if lanes == 1 else ir.VectorType(scalar, lanes)


def constant(dtype: str, value: float | int | bool, lanes: int = 1) -> ir.Constant:
    scalar_t = _SCALAR[register_dtype(dtype)]
    if isinstance(scalar_t, ir.IntType):
        bits = scalar_t.width
        value = int(value) & ((1 << bits) - 1) if bits > 1 else int(bool(value))
    scalar = ir.Constant(scalar_t, value)
    if lanes == 1:
        return scalar
    return ir.Constant(ir.VectorType(scalar_t, lanes), [scalar] * lanes)


def splat(builder: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
    """``value`` in every lane. Its constants are written as ``undef`` and
    ``zeroinitializer``, not lane by lane: splats were 44% of a model's IR text, which
    LLVM then parsed (docs/measurements.md)."""
    if lanes == 1:
        return value
    vec_t = ir.VectorType(value.type, lanes)
    undef = _Short(vec_t, ir.Undefined, "undef")
    one = builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0))
    mask = _Short(ir.VectorType(ir.IntType(32), lanes), [0] * lanes, "zeroinitializer")
    return builder.shuffle_vector(one, undef, mask)


class _Short(ir.Constant):
    """A vector constant that LLVM reads the same either way, written in one word."""

    def __init__(self, typ: ir.Type, constant, text: str):
        super().__init__(typ, constant)
        self.text = text

    def get_reference(self) -> str:
        return self.text


def lanes_of(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 1


def mangle(t: ir.Type) -> str:
    """LLVM's overload suffix for an intrinsic type: f32, v16f32, i64, v8i1 …"""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    if isinstance(t, ir.HalfType):
        return "f16"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    return f"i{t.width}"


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """Declare ``name`` on ``module`` once and reuse it."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, args), name)


def call_overloaded(
    builder: ir.IRBuilder, base: str, args: list[ir.Value], extra: list[ir.Value] = ()
) -> ir.Value:
    """Call ``llvm.<base>.<type>`` overloaded on the first argument's type."""
    t = args[0].type
    fn = intrinsic(builder.module, f"llvm.{base}.{mangle(t)}", t, [a.type for a in [*args, *extra]])
    return builder.call(fn, [*args, *extra])


class _LoopId(ir.values.MDValue):
    """A loop's metadata node: distinct, its first operand itself (LLVM's LangRef)."""

    def descr(self, buf):
        buf += ("distinct ",)
        super().descr(buf)

    # an operand of itself: identity, not MDValue's hash and equality of the operands
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other


def no_unroll(module: ir.Module) -> ir.values.MDValue:
    """A loop ID asking LLVM not to unroll the loop whose back edge carries it (as
    ``!llvm.loop``); one fresh node per loop."""
    disable = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    loop = _LoopId(module, [], name=str(len(module.metadata)))
    loop.operands = (loop, disable)
    return loop
