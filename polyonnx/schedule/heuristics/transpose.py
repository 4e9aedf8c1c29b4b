"""Default schedule for a copy that turns its rows: the output's rows run along a dim that
is not the input's innermost (a Transpose that moves the last axis, attention's K^T).

Vectorised along the output's rows, every vector would load its lanes one element each, a
row of the input apart. Here the two dims are tiled by the SIMD width W; a ``transpose``
mark over a tile's two loops has the code generator (emit/codegen.py) load W vectors along
the input's rows, transpose them in registers (log2 W rounds of two-vector shuffles) and
store W vectors along the output's rows::

    before:  for .. / for b / SIMD for a:   Y[.., b, a] = X[.., a, b]
    after:   for .. / for b_o / for a_o / transpose: for b_i / SIMD for a_i

A tile that sticks out of either dim (sizes not a multiple of W) loads and stores under
masks. Tiled measured several times faster than plain on a Zen 5 (docs/measurements.md,
'Transposes in registers').
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Buffer, Kernel, Load
from polyonnx.krnl.islutil import dim_names, extents, flat_stride
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.primitives.split import fresh
from polyonnx.schedule.state import TRANSPOSE, Nest, State, Var
from polyonnx.schedule.tree import KernelSchedule


def transpose_schedule(
    kernel: Kernel, buffers: Mapping[str, Buffer], lanes: int
) -> KernelSchedule | None:
    """The tiled schedule of the module docstring for a one-statement float32 copy whose
    output rows (dim ``a``) and input rows (dim ``b``) are different dims of at least
    ``lanes`` points each; else None."""
    if len(kernel.statements) != 1 or lanes < 2:
        return None
    stmt = kernel.statements[0]
    if stmt.reduce is not None or not isinstance(stmt.expr, Load):
        return None
    source = stmt.expr.access
    if {buffers[source.buffer].dtype, buffers[stmt.write.buffer].dtype} != {"float32"}:
        return None
    names, sizes = dim_names(stmt), extents(stmt)
    writes = [
        flat_stride(stmt.write, buffers[stmt.write.buffer].shape, p) for p in range(len(names))
    ]
    reads = [flat_stride(source, buffers[source.buffer].shape, p) for p in range(len(names))]
    if 1 not in writes or 1 not in reads:
        return None
    a, b = writes.index(1), reads.index(1)
    if a == b or reads[a] in (0, None) or writes[b] in (0, None):
        return None
    if min(sizes[a], sizes[b]) < lanes:
        return None
    state = State.original(kernel)
    ao, bo = fresh(state, f"{names[a]}_o"), fresh(state, f"{names[b]}_o")
    ai, bi = fresh(state, f"{names[a]}_i"), fresh(state, f"{names[b]}_i")
    tile = {d: f"floor(({d})/{lanes})" for d in (names[a], names[b])}
    loops = [Var(d, d) for p, d in enumerate(names) if p not in (a, b)]
    loops += [Var(bo, tile[names[b]]), Var(ao, tile[names[a]])]
    loops += [
        Var(bi, f"({names[b]}) - {lanes}*{tile[names[b]]}"),
        Var(ai, f"({names[a]}) - {lanes}*{tile[names[a]]}"),
    ]
    state = state.with_nests((Nest(stmt.name, tuple(loops)),))
    deps = dependences(kernel)
    if broken_order(state, deps) is not None:
        return None
    with contextlib.suppress(ScheduleError):
        state = annotate.vectorize(state, deps, ai)
    return state.with_mark(bi, TRANSPOSE).to_kernel_schedule()
