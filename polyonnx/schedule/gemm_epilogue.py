"""The statements the micro-kernel fuses around its contraction: the init before it (its
accumulators start from it) and the epilogue after it (applied on the register tile
before the one store), and the loads they read along the GEMM's rows and columns."""

from __future__ import annotations

import islpy as isl

from polyonnx.krnl.ir import Binary, Cast, Const, Load, Select, Statement, Unary, children, loads
from polyonnx.krnl.islutil import dim_names, is_whole_identity, parse_access
from polyonnx.schedule.gemm import Affine, Geometry, affine, column_step, integral
from polyonnx.schedule.state import Var


def epilogue_statements(kernel, host: Statement, geo: Geometry, buffers) -> list[Statement]:
    """The statements after ``host`` that rewrite its output element for element with an
    expression the micro-kernel can compute on a register tile: loads of the output at
    the same element, of other buffers along rows (a bias per channel) or contiguously
    along the columns (a residual), constants, arithmetic, selects and casts."""
    found = []
    after = kernel.statements[kernel.statements.index(host) + 1 :]
    for stmt in after:
        if epilogue_loads(host, stmt, geo, buffers) is None:
            break
        found.append(stmt)
    return found


def prologue_statement(kernel, host: Statement, geo: Geometry, buffers) -> Statement | None:
    """The statement right before ``host`` that initialises its output element for
    element without reading it (zero, a bias, Gemm's C): the micro-kernel starts its
    accumulators from it instead of storing it first and loading it back."""
    index = kernel.statements.index(host)
    if index == 0:
        return None
    init = kernel.statements[index - 1]
    out = host.write.buffer
    if any(ld.access.buffer == out for ld in loads(init.expr)):
        return None
    if epilogue_loads(host, init, geo, buffers) is None:
        return None
    return init


def epilogue_loads(host: Statement, stmt: Statement, geo: Geometry, buffers):
    """{access: (Affine over the host's dims, column step 0 or 1)} of the loads of another
    buffer in epilogue statement ``stmt``, or None when ``stmt`` is not an epilogue."""
    coords = _coordinate_dims(host)
    out = host.write.buffer
    if (
        coords is None
        or stmt.reduce is not None
        or stmt.write.buffer != out
        or not is_whole_identity(stmt, stmt.write.index, buffers[out].shape)
        or not _simple(stmt.expr)
    ):
        return None
    found = {}
    for ld in loads(stmt.expr):
        if ld.access.buffer == out:
            if not is_whole_identity(stmt, ld.access.index, buffers[out].shape):
                return None
            continue
        own = affine(ld.access.buffer, ld.access.index, buffers)
        if own is None or ld.dtype != "float32":
            return None
        coeffs = [0] * len(geo.dims)
        for p, d in enumerate(coords):
            if d is not None:
                coeffs[d] += own.coeffs[p]
        step = column_step(coeffs, geo)
        if step is None:
            return None
        found[ld.access] = (Affine(ld.access.buffer, tuple(coeffs), own.const), step)
    return found


def _simple(expr) -> bool:
    if isinstance(expr, (Load, Const)):
        return expr.dtype in ("float32", "bool")
    if isinstance(expr, (Unary, Binary, Select, Cast)):
        return all(_simple(x) for x in children(expr))
    return False


def _coordinate_dims(stmt: Statement) -> list[int | None] | None:
    """For each coordinate of the statement's write, the dim it equals (None: always 0)."""
    maff = parse_access(stmt.write.index)
    if any(not integral(maff.get_aff(r)) for r in range(maff.dim(isl.dim_type.out))):
        return None
    count = maff.dim(isl.dim_type.in_)
    found = []
    for r in range(maff.dim(isl.dim_type.out)):
        aff = maff.get_aff(r)
        if aff.dim(isl.dim_type.div):
            return None
        terms = [
            (d, int(aff.get_coefficient_val(isl.dim_type.in_, d).to_python())) for d in range(count)
        ]
        terms = [(d, c) for d, c in terms if c]
        const = int(aff.get_constant_val().to_python())
        if const:
            return None
        if not terms:
            found.append(None)
        elif len(terms) == 1 and terms[0][1] == 1:
            found.append(terms[0][0])
        else:
            return None
    return found


def epilogue_var(host: Statement, tail: Statement, loop: Var) -> Var:
    """``loop`` of the host (over host dim ``loop.expr``) as a loop over the tail's dims."""
    coords = _coordinate_dims(host)
    dim = dim_names(host).index(loop.expr)
    names = dim_names(tail)
    for p, d in enumerate(coords):
        if d == dim:
            return Var(loop.name, names[p])
    return Var(loop.name, "0")
