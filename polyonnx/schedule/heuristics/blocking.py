"""Default register blocking for contractions (MatMul, Gemm, Conv, batched attention
products): the sum ``Y[.., i, .., j] += A[.., i, .., k] * B[.., k, .., j]``.

The SIMD loop J is the dim along which Y is contiguous; the blocked loop I is a dim the
vector operand does not depend on, so each vector loaded along J is reused for MR rows.
The statement becomes

    for (outer) / for I_o / for J_o / for (reduction dims)
        for I_i (unrolled, MR) / for J_i (SIMD, NR = 4 vectors)
            Y[I, J] += splat(A[I, k]) * B[k, J]

so the MR x NR accumulator tile stays in vector registers across the reduction loops
(LLVM promotes it: the loops inside the reduction touch no other part of Y). Contractions
of at least PARALLEL_WORK multiply-adds also run their outermost loop on threads.

With fewer than MR rows (a matrix-vector product, ``y[j] += a[k] * B[k, j]``, has no I at
all) each element of B is used once or twice, so reading B is the whole cost, and a column
strip of every row at a time reads it badly: each row's 256 bytes sit in another page. The
single reduction dim is then cut into blocks of ROW_BLOCK rows that are read side by side,
each from start to end (docs/measurements.md, 'Matrix-vector rows side by side'), or
with a second, short reduction dim (slices of K far apart, krnl/ops/matmul.py), its rows
are the ones side by side.
A big one is also cut into GEMV_CHUNKS column chunks, the loop threads share, unless it
has a loop outside the reduction already (the parts of a split K, krnl/ops/matmul.py):

    for (outer) / for I_o / for J_c / for k_o / for J_o / for k_i (unrolled) / for I_i /
        for J_i (SIMD)

Where the SIMD dim starts inside a tile (an input B read shifted onto cache lines), the
whole J_o tiles are generated apart (isl's isolate option), with constant bounds.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

import islpy as isl

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Binary, Buffer, Kernel, Load, Statement
from polyonnx.krnl.islutil import dim_names, extents, flat_stride, parse_set, tuple_names
from polyonnx.schedule.deps import dependences
from polyonnx.schedule.heuristics.gemm_defaults import PARALLEL_WORK
from polyonnx.schedule.legality import broken_order
from polyonnx.schedule.primitives import annotate
from polyonnx.schedule.primitives.reorder import reorder
from polyonnx.schedule.primitives.split import split
from polyonnx.schedule.state import State
from polyonnx.schedule.tree import KernelSchedule

MR = 4
GEMV_CHUNKS = 2
"""Column chunks of a big matrix-vector product, so threads have a loop outside the
reduction; each chunk reads its part of every row start to end. Two won at 2 threads and
cost less than four at 1 (docs/measurements.md, 'Matrix-vector column chunks')."""
VECTORS = 4
MIN_EXTENT = 16
MAX_STEP = 16
"""The longest step (in elements) between the lanes of a vector loaded a lane at a time:
a strided Conv's input (step 2-4) shares cache lines between lanes; the weights of a Gemm
with transB (step K) do not, and its rows are dot products instead (docs/measurements.md,
'Dot products for far-apart lanes')."""
ROW_BLOCK = 8


def blocked_schedule(
    kernel: Kernel, buffers: Mapping[str, Buffer], lanes: int
) -> KernelSchedule | None:
    """The register-blocked schedule of a kernel with one contraction, or None."""
    found = [s for s in kernel.statements if _plan(s, buffers, lanes) is not None]
    if len(found) != 1:
        return None
    stmt = found[0]
    block, simd, reduced, outer = _plan(stmt, buffers, lanes)
    extent = dict(zip(dim_names(stmt), extents(stmt), strict=True))
    state = State.original(kernel)
    width = min(VECTORS * lanes, -(-extent[simd] // lanes) * lanes)
    rows, heads, tiles, sizes = 1, [], [], dict(extent)
    if block is not None:
        rows = extent[block]
        state, i_o, i_i = split(state, block, min(MR, rows))
        heads, tiles, sizes[i_o] = [i_o], [i_i], -(-rows // min(MR, rows))
    state, j_o, j_i = split(state, simd, width)
    slices = len(reduced) == 2 and 2 <= extent[reduced[1]] <= ROW_BLOCK
    slices = slices and _far_apart(stmt, buffers, reduced, extent)
    rows_long = len(reduced) == 1 and extent[reduced[0]] >= 2 * ROW_BLOCK
    if rows < MR and (slices or rows_long):
        # a GEMV (or nearly): B is read once, so read it as DRAM likes, a few rows side
        # by side from start to end, not a column strip of every row at a time
        if slices:  # slices of K far apart (krnl/ops/matmul.py's SIDE_BY_SIDE)
            k_o, k_i = reduced
        else:  # ROW_BLOCK rows in a row
            state, k_o, k_i = split(state, reduced[0], ROW_BLOCK)
        middle, inner = [k_o, j_o], [k_i]
        strips = -(-extent[simd] // width)
        threaded = any(extent[d] >= 2 for d in outer)  # a split K: threads take its parts
        if math.prod(extents(stmt)) >= PARALLEL_WORK and strips >= 2 * GEMV_CHUNKS and not threaded:
            # threads need a loop outside the reduction: whole column chunks
            state, j_c, j_o = split(state, j_o, -(-strips // GEMV_CHUNKS))
            heads, middle = [*heads, j_c], [k_o, j_o]
            sizes[j_c] = GEMV_CHUNKS
    else:
        middle, inner = [j_o, *reduced], []
    state = reorder(state, [*outer, *heads, *middle, *inner, *tiles, j_i])
    deps = dependences(kernel)
    if broken_order(state, deps) is not None:
        return None
    try:
        state = annotate.vectorize(state, deps, j_i)
        for loop in [*inner, *tiles]:
            state = annotate.unroll(state, loop)
    except ScheduleError:  # any refusal means: keep the plain default
        return None
    wide = [v for v in (*outer, *heads) if sizes[v] >= 2]
    if math.prod(extents(stmt)) >= PARALLEL_WORK and wide:
        first = wide[0]
        # threads for big contractions; small ones would spend more starting them
        with contextlib.suppress(ScheduleError):
            state = annotate.parallel(state, deps, first)
    columns = parse_set(stmt.domain)
    at = dim_names(stmt).index(simd)
    low, high = (f(at).to_python() for f in (columns.dim_min_val, columns.dim_max_val))
    if low % width == 0:
        return state.to_kernel_schedule()
    # columns that start inside a tile (a one-row MatMul's input B read shifted, krnl/ops/
    # matmul.py's INPUT_OFFSET): the whole tiles apart, so that their loops have constant
    # bounds (one body for all the slices' rows, not a loop each)
    whole = (-(-low // width), (high + 1) // width - 1)
    position = state.nest(stmt.name).position(j_o)
    tree = _isolated(state.isl_schedule().get_root(), stmt.name, position, whole, 0)
    return KernelSchedule(kernel, str(tree.get_schedule()), state)


def _isolated(node: isl.ScheduleNode, name: str, position: int, whole, outer: int):
    """The isolate option on the band member ``position`` of statement ``name``'s loops:
    its values ``whole`` (first, last) generated apart from the others."""
    kind = node.get_type()
    if kind == isl.schedule_node_type.filter and name not in tuple_names(node.filter_get_filter()):
        return node
    if kind == isl.schedule_node_type.band:
        members = node.band_n_member()
        if outer <= position < outer + members:
            prefix = ", ".join(f"o{d}" for d in range(outer))
            band = [f"b{d}" for d in range(members)]
            at = band[position - outer]
            space = f"isolate[[{prefix}] -> [{', '.join(band)}]]"
            option = f"{{ {space} : {whole[0]} <= {at} <= {whole[1]} }}"
            return node.band_set_ast_build_options(isl.UnionSet(option))
        outer += members
    for index in range(node.n_children()):
        node = _isolated(node.child(index), name, position, whole, outer).parent()
    return node


def _far_apart(stmt: Statement, buffers: Mapping[str, Buffer], reduced, extent) -> bool:
    """Whether the second of two reduction dims steps every operand past the whole first
    one (slices of a split K), rather than within it (a Conv1D's channels and taps)."""
    names = dim_names(stmt)
    outer, inner = (names.index(d) for d in reduced)
    for load in (stmt.expr.a, stmt.expr.b):
        shape = buffers[load.access.buffer].shape
        step, span = (flat_stride(load.access, shape, p) for p in (inner, outer))
        if step is None or span is None or abs(step) < abs(span) * extent[reduced[0]]:
            return False
    return True


def _plan(stmt: Statement, buffers: Mapping[str, Buffer], lanes: int):
    """(block dim, simd dim, reduction dims, other dims) for a contraction, else None."""
    if stmt.reduce != "add" or not isinstance(stmt.expr, Binary) or stmt.expr.op != "mul":
        return None
    operands = [stmt.expr.a, stmt.expr.b]
    if not all(isinstance(x, Load) for x in operands) or stmt.expr.dtype not in (
        "float32",
        "float64",
    ):
        return None
    names = dim_names(stmt)
    sizes = extents(stmt)
    shape = buffers[stmt.write.buffer].shape
    strides = [flat_stride(stmt.write, shape, p) for p in range(len(names))]
    reduced = [n for n, s in zip(names, strides, strict=True) if s == 0]
    simd = [p for p, s in enumerate(strides) if s == 1 and sizes[p] >= MIN_EXTENT]
    if not reduced or not simd:
        return None
    j = simd[0]
    steps = [flat_stride(x.access, buffers[x.access.buffer].shape, j) for x in operands]
    # the operand that moves along j is loaded a vector at a time (contiguous) or a lane at
    # a time (a strided conv's input); the other one must not move (a splat)
    vector = [x for x, step in zip(operands, steps, strict=True) if step not in (0, None)]
    if len(vector) != 1 or 0 not in steps:
        return None
    vec = vector[0]
    blocks = [
        p for p, s in enumerate(strides)
        if p != j and s not in (0, None) and sizes[p] >= 2
        and flat_stride(vec.access, buffers[vec.access.buffer].shape, p) == 0
    ]  # fmt: skip
    step = steps[operands.index(vec)]
    if step != 1 and (not blocks or step > MAX_STEP):
        return None  # rows of dot products (a Gemm with transB): the plain default
    i = blocks[-1] if blocks else None  # none: one row, a matrix-vector product
    outer = [n for p, n in enumerate(names) if p not in (i, j) and n not in reduced]
    return (names[i] if i is not None else None), names[j], reduced, outer
