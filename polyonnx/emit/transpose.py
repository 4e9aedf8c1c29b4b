"""The ``transpose`` mark (schedule/transpose.py): a W x W tile of a copy that turns its
rows, loaded as W vectors along the input's rows, transposed in registers and stored as W
vectors along the output's rows. Where the tile sticks out of the data (its loops end
before W), the loops under the mark run as they are."""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl
from llvmlite import ir

from polyonnx.emit.astgen import Instance
from polyonnx.emit.llvmtypes import I64, memory_type
from polyonnx.krnl.ir import Access, Load


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
    inner = _loop_body(walker, node)
    if inner is None:
        return None
    user = inner.for_get_body()
    if user.get_type() != isl.ast_node_type.user or _loop_body(walker, inner, False) is None:
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


def _loop_body(walker, node: isl.AstNode, descend: bool = True) -> isl.AstNode | None:
    """``node``'s body loop (through a mark) when ``node`` is a unit-step loop from 0
    bounded above (``node`` itself when not ``descend``), else None."""
    if node.get_type() != isl.ast_node_type.for_ or walker._upper_bound(node) is None:
        return None
    init, inc = node.for_get_init(), node.for_get_inc()
    for e, value in ((init, 0), (inc, 1)):
        if e.get_type() != isl.ast_expr_type.int or e.get_val().to_python() != value:
            return None
    if not descend:
        return node
    body = node.for_get_body()
    while body.get_type() == isl.ast_node_type.mark:
        body = body.mark_get_node()
    return body if body.get_type() == isl.ast_node_type.for_ else None


def emit(walker, tile: Tile, env: dict[str, ir.Value]) -> None:
    """The whole tile in registers when both its loops run W times, else its loops."""
    b, width = walker.b, walker.width
    zero = ir.Constant(I64, 0)
    whole = ir.Constant(ir.IntType(1), 1)
    for loop, at in ((tile.outer, env), (tile.inner, {**env, tile.across: zero})):
        bound, inclusive = walker._upper_bound(loop)
        runs = walker.expr(bound, at)  # the last iteration, or one past it
        full = ir.Constant(I64, width - 1 if inclusive else width)
        whole = b.and_(whole, b.icmp_signed("==", runs, full))
    with b.if_else(whole) as (then, otherwise):
        with then:
            _registers(walker, tile, env)
        with otherwise:
            walker.node(tile.outer, env)


def _registers(walker, tile: Tile, env: dict[str, ir.Value]) -> None:
    b, width = walker.b, walker.width
    vector = memory_type(tile.dtype, width)
    rows = []
    for r in range(width):
        at = {**env, tile.across: ir.Constant(I64, 0), tile.along: ir.Constant(I64, r)}
        rows.append(b.load(walker.address(tile.inst, tile.source, at), typ=vector, align=4))
    for c, column in enumerate(transposed(b, rows)):
        at = {**env, tile.across: ir.Constant(I64, c), tile.along: ir.Constant(I64, 0)}
        b.store(column, walker.address(tile.inst, tile.inst.stmt.write, at), align=4)


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
