"""Small IR helpers and shared constants of the GEMM emitter (emit/ukernel.py, its packing
in emit/packing.py and its tap loops in emit/taps.py): a counted loop, integer min/max and
rounding, affine sums of loop values, and ``Vectors``: the vector types, intrinsics and
constants the GEMM emitter builds with."""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from polyonnx.emit.llvmtypes import I64, PTR, intrinsic, splat

F32 = ir.FloatType()
I32 = ir.IntType(32)
LINE_FLOATS = 16
"""float32 values in a 64-byte cache line."""
DOT_COLUMNS = 3
"""A tile's last columns past whole vectors, up to this many, are dot products along k
(_Gemm.dot_columns) rather than one more vector of FMAs with most lanes idle (a 7x7
Conv's 49th column). From 4 columns of 8 lanes the vector is the faster; with 2 or 3
columns, dot products or a vector measured alike (see docs/measurements.md)."""


class loop:
    """``for (it = start; it < stop; it += step)``; yields the i64 iterator."""

    def __init__(self, b: ir.IRBuilder, start, stop, step: int, name: str):
        self.b, self.start, self.stop, self.step, self.name = b, start, stop, step, name

    def __enter__(self) -> ir.Value:
        b = self.b
        pre = b.block
        self.head = b.append_basic_block(f"{self.name}.head")
        body = b.append_basic_block(f"{self.name}.body")
        self.exit = b.append_basic_block(f"{self.name}.exit")
        b.branch(self.head)
        b.position_at_end(self.head)
        self.it = b.phi(I64, self.name)
        self.it.add_incoming(self.start, pre)
        b.cbranch(b.icmp_signed("<", self.it, self.stop), body, self.exit)
        b.position_at_end(body)
        return self.it

    def __exit__(self, *exc) -> None:
        b = self.b
        self.it.add_incoming(b.add(self.it, ir.Constant(I64, self.step)), b.block)
        b.branch(self.head)
        b.position_at_end(self.exit)


def transpose(b: ir.IRBuilder, rows: list[ir.Value], lanes: int) -> ir.Value:
    """The vectors ``rows`` (R of ``lanes`` floats) as one vector of R * lanes, column by
    column: element ``k * R + r`` is lane k of row r. Concatenated pairwise (padded with
    undefined vectors to a power of two), then one permutation."""
    parts = list(rows) + [ir.Constant(rows[0].type, ir.Undefined)] * (
        (1 << (len(rows) - 1).bit_length()) - len(rows)
    )
    while len(parts) > 1:
        size = len(parts[0].type) * 2
        mask = ir.Constant(ir.VectorType(I32, size), list(range(size)))
        parts = [b.shuffle_vector(x, y, mask) for x, y in zip(parts[::2], parts[1::2], strict=True)]
    whole = parts[0]
    order = [r * lanes + k for k in range(lanes) for r in range(len(rows))]
    mask = ir.Constant(ir.VectorType(I32, len(order)), order)
    return b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined), mask)


def unflatten(b: ir.IRBuilder, flat: ir.Value, dims) -> dict[int, ir.Value]:
    """Row-major digits of ``flat`` over ``dims`` ((position, extent), outermost first)."""
    values = {}
    for d, size in reversed(dims):
        if size == 1:
            values[d] = ir.Constant(I64, 0)
            continue
        values[d] = b.srem(flat, ir.Constant(I64, size))
        flat = b.sdiv(flat, ir.Constant(I64, size))
    return values


def dot(b, coeffs, values: dict[int, ir.Value], const: int, start=None) -> ir.Value:
    total = start if start is not None else ir.Constant(I64, const)
    if start is not None and const:
        total = b.add(total, ir.Constant(I64, const))
    for d, value in values.items():
        if coeffs[d]:
            total = b.add(total, b.mul(value, ir.Constant(I64, coeffs[d])))
    return total


def floor_div(b: ir.IRBuilder, x: ir.Value, d: int) -> ir.Value:
    """floor(x / d) for a positive constant d."""
    q = b.sdiv(x, ir.Constant(I64, d))
    fix = b.icmp_signed("<", b.srem(x, ir.Constant(I64, d)), ir.Constant(I64, 0))
    return b.sub(q, b.zext(fix, I64))


def i32(value: int) -> ir.Constant:
    return ir.Constant(I32, value)


def round_up(b: ir.IRBuilder, x: ir.Value, multiple: int) -> ir.Value:
    m = ir.Constant(I64, multiple)
    return b.mul(b.sdiv(b.add(x, ir.Constant(I64, multiple - 1)), m), m)


def at_most(b: ir.IRBuilder, x: ir.Value, limit: int) -> ir.Value:
    return lesser(b, x, ir.Constant(I64, limit))


def at_least(b: ir.IRBuilder, x: ir.Value, limit: int) -> ir.Value:
    return greater(b, x, ir.Constant(I64, limit))


def lesser(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def greater(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


@dataclass(frozen=True, eq=False)
class Vectors:
    """The IR builder and what code on ``lanes``-wide float vectors needs: the types, the
    intrinsics (declared once on the module) and the constants."""

    b: ir.IRBuilder
    lanes: int
    vec: ir.VectorType
    mask_t: ir.VectorType
    fma: ir.Function
    mload: ir.Function
    mstore: ir.Function
    gather: ir.Function
    prefetch: ir.Function
    zero: ir.Constant
    all_lanes: ir.Constant
    lane_ids: ir.Constant

    @classmethod
    def declare(cls, b: ir.IRBuilder, lanes: int, *, multiply_add: str) -> Vectors:
        """Declare the intrinsics on ``b``'s module; ``multiply_add``: ``fma`` or
        ``fmuladd``."""
        module = b.module
        vec = ir.VectorType(F32, lanes)
        mask_t = ir.VectorType(ir.IntType(1), lanes)
        fma = intrinsic(module, f"llvm.{multiply_add}.v{lanes}f32", vec, [vec] * 3)
        mload = intrinsic(module, f"llvm.masked.load.v{lanes}f32.p0", vec, [PTR, I32, mask_t, vec])
        mstore = intrinsic(
            module, f"llvm.masked.store.v{lanes}f32.p0", ir.VoidType(), [vec, PTR, I32, mask_t]
        )
        ptrs = ir.VectorType(PTR, lanes)
        gather = intrinsic(
            module, f"llvm.masked.gather.v{lanes}f32.v{lanes}p0", vec, [ptrs, I32, mask_t, vec]
        )
        prefetch = intrinsic(module, "llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        return cls(
            b=b,
            lanes=lanes,
            vec=vec,
            mask_t=mask_t,
            fma=fma,
            mload=mload,
            mstore=mstore,
            gather=gather,
            prefetch=prefetch,
            zero=ir.Constant(vec, [0.0] * lanes),
            all_lanes=ir.Constant(mask_t, [1] * lanes),
            lane_ids=ir.Constant(ir.VectorType(I32, lanes), list(range(lanes))),
        )

    def at(self, ptr: ir.Value, offset: ir.Value | int) -> ir.Value:
        """``ptr`` advanced by ``offset`` floats."""
        if isinstance(offset, int):
            offset = ir.Constant(I64, offset)
        return self.b.gep(ptr, [offset], source_etype=F32)

    def below(self, start: ir.Value, limit: ir.Value) -> ir.Value:
        """Lanes l with start + l < limit (i64 scalars)."""
        b = self.b
        low = ir.Constant(I64, -1)
        high = ir.Constant(I64, self.lanes + 1)
        room = b.sub(limit, start)
        room = b.select(b.icmp_signed("<", room, low), low, room)
        room = b.trunc(b.select(b.icmp_signed(">", room, high), high, room), I32)
        return b.icmp_signed("<", self.lane_ids, splat(b, room, self.lanes))
