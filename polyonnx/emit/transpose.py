"""The ``transpose`` mark (schedule/heuristics/transpose.py): a W x W tile of a copy that turns its
rows, loaded as W vectors along the input's rows, transposed in registers and stored as W
vectors along the output's rows. Where the tile sticks out of the data (its loops end
before W), the same under masks."""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl
from llvmlite import ir

from polyonnx.emit.irhelp import I32
from polyonnx.emit.llvmtypes import I64, PTR, intrinsic, mangle, memory_type, splat
from polyonnx.krnl.ir import Access, Load
from polyonnx.schedule.astgen import Instance


@dataclass(frozen=True)
class Tile:
    outer: isl.AstNode
    """The loop along the input's rows (``b_i``); its body holds the loop along the
    output's rows (``a_i``) over the copy."""
    across: str
    along: str
    """The iterators of the outer and inner loop."""
    inner: isl.AstNode
    inst: Instance
    source: Access
    dtype: str


def tile_of(walker, node: isl.AstNode) -> Tile | None:
    """The tile under a ``transpose`` mark, or None when the loops are not two unit-step
    loops from 0 over one copy statement read along the outer one and written along the
    inner one, a vector wide."""
    if not _from_zero(walker, node):
        return None
    inner = _unmarked(node.for_get_body())
    if not _from_zero(walker, inner):
        return None
    user = inner.for_get_body()
    if user.get_type() != isl.ast_node_type.user:
        return None
    inst = walker.instance(user)
    if not isinstance(inst.stmt.expr, Load) or inst.stmt.reduce is not None:
        return None
    across = node.for_get_iterator().get_id().get_name()
    along = inner.for_get_iterator().get_id().get_name()
    source, write = inst.stmt.expr.access, inst.stmt.write
    dtype = walker.buffers[source.buffer].dtype
    if dtype != "float32" or walker.buffers[write.buffer].dtype != dtype:
        return None
    reads, writes = inst.accesses[source].steps, inst.accesses[write].steps
    if reads.get(across) != 1 or writes.get(along) != 1:
        return None
    if reads.get(along) is None or writes.get(across) is None:
        return None
    return Tile(node, across, along, inner, inst, source, dtype)


def _from_zero(walker, node: isl.AstNode) -> bool:
    """Whether ``node`` is a unit-step loop from 0, bounded above."""
    if node.get_type() != isl.ast_node_type.for_ or walker.upper_bound(node) is None:
        return False
    init, inc = node.for_get_init(), node.for_get_inc()
    return all(
        e.get_type() == isl.ast_expr_type.int and e.get_val().to_python() == value
        for e, value in ((init, 0), (inc, 1))
    )


def _unmarked(node: isl.AstNode) -> isl.AstNode:
    """``node``, or the node under its marks (the inner loop's ``vectorize``)."""
    while node.get_type() == isl.ast_node_type.mark:
        node = node.mark_get_node()
    return node


def emit(walker, tile: Tile, env: dict[str, ir.Value]) -> None:
    """The tile in registers: plain loads and stores when both its loops run W times, else
    masked ones over the rows and lanes inside the data."""
    b, width = walker.b, walker.width
    counts = []
    for loop, at in ((tile.outer, env), (tile.inner, {**env, tile.across: ir.Constant(I64, 0)})):
        bound, inclusive = walker.upper_bound(loop)
        runs = walker.expr(bound, at)  # the last iteration, or one past it
        counts.append(b.add(runs, ir.Constant(I64, 1)) if inclusive else runs)
    full = ir.Constant(I64, width)
    whole = b.and_(*(b.icmp_signed("==", n, full) for n in counts))
    with b.if_else(whole) as (then, otherwise):
        with then:
            _registers(walker, tile, env, None)
        with otherwise:
            _registers(walker, tile, env, counts)


def _registers(walker, tile: Tile, env: dict[str, ir.Value], counts) -> None:
    """Load W vectors along the input's rows (row r: ``along`` = r), transpose, store W
    along the output's rows (row c: ``across`` = c). With ``counts`` (the iterations of
    the ``across`` and ``along`` loops), rows and lanes past them are masked off."""
    b, width = walker.b, walker.width
    vector = memory_type(tile.dtype, width)
    across, along = counts if counts is not None else (None, None)
    masks = _Masks(b, width, counts)
    rows = []
    for r in range(width):
        at, mask = masks.row(r, along, across)
        point = {**env, tile.across: ir.Constant(I64, 0), tile.along: at}
        address = walker.address(tile.inst, tile.source, point)
        rows.append(masks.load(address, vector, mask))
    for c, column in enumerate(transposed(b, rows)):
        at, mask = masks.row(c, across, along)
        point = {**env, tile.across: at, tile.along: ir.Constant(I64, 0)}
        masks.store(column, walker.address(tile.inst, tile.inst.stmt.write, point), mask)


class _Masks:
    """Plain loads and stores of whole tiles; of partial ones, masked loads and stores
    (masked-off lanes are never touched in memory) with rows past the data at row 0."""

    def __init__(self, b: ir.IRBuilder, width: int, counts) -> None:
        self.b, self.width, self.counts = b, width, counts
        self.type = ir.VectorType(ir.IntType(1), width)
        self.none = ir.Constant(self.type, [0] * width)
        self.lanes = ir.Constant(ir.VectorType(I64, width), list(range(width)))

    def row(self, index: int, rows, lanes):
        """Row ``index`` (0 if ``rows`` rows end before it) and its lanes below ``lanes``."""
        at = ir.Constant(I64, index)
        if self.counts is None:
            return at, None
        b = self.b
        live = b.icmp_signed("<", at, rows)
        inside = b.icmp_signed("<", self.lanes, splat(b, lanes, self.width))
        return b.select(live, at, ir.Constant(I64, 0)), b.select(live, inside, self.none)

    def load(self, address: ir.Value, vector: ir.VectorType, mask) -> ir.Value:
        if mask is None:
            return self.b.load(address, typ=vector, align=4)
        fn = intrinsic(
            self.b.module,
            f"llvm.masked.load.{mangle(vector)}.p0",
            vector,
            [PTR, I32, self.type, vector],
        )
        return self.b.call(fn, [address, ir.Constant(I32, 4), mask, ir.Constant(vector, None)])

    def store(self, value: ir.Value, address: ir.Value, mask) -> None:
        if mask is None:
            self.b.store(value, address, align=4)
            return
        fn = intrinsic(
            self.b.module,
            f"llvm.masked.store.{mangle(value.type)}.p0",
            ir.VoidType(),
            [value.type, PTR, I32, self.type],
        )
        self.b.call(fn, [value, address, ir.Constant(I32, 4), mask])


def transposed(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The W vectors ``rows`` (W a power of two) transposed: log2 W rounds, each swapping
    the off-diagonal blocks of every block pair, half as wide as the round before, with
    two two-vector shuffles per pair of rows."""
    n = len(rows)
    rows = list(rows)
    size = n // 2
    while size >= 1:
        low = [n + c - size if c & size else c for c in range(n)]
        high = [n + c if c & size else c + size for c in range(n)]
        masks = [ir.Constant(ir.VectorType(ir.IntType(32), n), m) for m in (low, high)]
        for i in range(n):
            if i & size:
                continue
            j = i + size
            rows[i], rows[j] = (b.shuffle_vector(rows[i], rows[j], m) for m in masks)
        size //= 2
    return rows
