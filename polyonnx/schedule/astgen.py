"""isl AST generation for one scheduled kernel.

Each user node of the AST is annotated with a :class:`Instance`: its statement and, for
every access and domain dim, the index as isl AST expressions over the loop iterators
plus the flat stride along each iterator (what vectorisation needs to know).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polyonnx.errors import CodegenError
from polyonnx.krnl.ir import Access, Buffer, Statement, loads
from polyonnx.krnl.islutil import dim_names, isl_callbacks, parse_access, parse_set
from polyonnx.krnl.params import Dim, Poly, strides
from polyonnx.schedule.tree import KernelSchedule


@dataclass(frozen=True)
class Index:
    """An affine index: one AST expression per buffer dim, the row-major strides of the
    buffer, and the flat element stride along each loop iterator (None: not affine)."""

    exprs: tuple[isl.AstExpr, ...]
    strides: tuple[Dim, ...]
    """Ints, or polynomials in the parameters (krnl/params.py) of a parametric kernel."""
    steps: dict[str, int | None]
    flat: isl.AstExpr | None = None
    """The flat element offset as one expression (None for a dim value): simpler than the
    per-dim sum, and affine where the dims are not (a coalesced loop's floor/mod terms
    cancel in the offset)."""


@dataclass(frozen=True)
class Instance:
    stmt: Statement
    accesses: dict[Access, Index]
    dims: dict[str, Index]


@dataclass(frozen=True)
class KernelAst:
    root: isl.AstNode
    instances: dict[str, Instance]
    statements: tuple[Statement, ...]
    """The kernel's statements, in kernel order."""


INDEX_LIMIT = 2**63 - 1
"""The largest element count of a buffer and the largest loop bound: native code indexes
with 64-bit signed integers."""


def build_ast(schedule: KernelSchedule, buffers: dict[str, Buffer]) -> KernelAst:
    _check_index_range(schedule.kernel.name, schedule.kernel.statements, buffers)
    stmts = {s.name: s for s in schedule.kernel.statements}
    instances: dict[str, Instance] = {}

    def at_each_domain(node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        relation = isl.Map.from_union_map(build.get_schedule())
        stmt = stmts[relation.get_tuple_name(isl.dim_type.in_)]
        space = build.get_schedule_space()
        iterators = [
            space.get_dim_name(isl.dim_type.set, d) for d in range(space.dim(isl.dim_type.set))
        ]
        to_domain = isl.PwMultiAff.from_map(relation.reverse())
        accesses = {}
        for acc in [stmt.write, *(ld.access for ld in loads(stmt.expr))]:
            shape = buffers[acc.buffer].shape
            index = isl.PwMultiAff.from_multi_aff(parse_access(acc.index))
            accesses[acc] = _index(build, index.pullback_pw_multi_aff(to_domain), shape, iterators)
        dims = {}
        for pos, name in enumerate(dim_names(stmt)):
            dims[name] = _index(build, to_domain.get_pw_aff(pos), None, iterators)
        key = f"I{len(instances)}"
        instances[key] = Instance(stmt, accesses, dims)
        return node.set_annotation(isl.Id(key))

    with isl_callbacks(f"building the AST of kernel {schedule.kernel.name!r}") as guard:
        build = isl.AstBuild.from_context(parameter_context(schedule.kernel.statements))
        build, _callback = build.set_at_each_domain(guard.node(at_each_domain))
        root = build.node_from_schedule(schedule.isl_schedule())
    return KernelAst(root, instances, schedule.kernel.statements)


def kernel_parameters(statements) -> tuple[str, ...]:
    """The isl parameters of a kernel's domains (krnl/params.py), in their order."""
    space = parse_set(statements[0].domain).get_space() if statements else None
    if space is None:
        return ()
    count = space.dim(isl.dim_type.param)
    return tuple(space.get_dim_name(isl.dim_type.param, d) for d in range(count))


def parameter_context(statements) -> isl.Set:
    """What the AST may assume of the parameters: every one is at least 1."""
    names = kernel_parameters(statements)
    if not names:
        return isl.Set("{ : }")
    bounds = " and ".join(f"{n} >= 1" for n in names)
    return isl.Set(f"[{', '.join(names)}] -> {{ : {bounds} }}")


def _check_index_range(kernel: str, statements, buffers: dict[str, Buffer]) -> None:
    """Refuse, naming the kernel, what 64-bit index arithmetic cannot hold: a buffer of
    more than INDEX_LIMIT elements, or a loop bound beyond it."""
    for stmt in statements:
        for acc in [stmt.write, *(ld.access for ld in loads(stmt.expr))]:
            shape = buffers[acc.buffer].shape
            if any(isinstance(n, Poly) for n in shape):
                continue  # sized at run time: runtime/parametric.py checks it per size
            if math.prod(max(int(n), 1) for n in shape) > INDEX_LIMIT:
                raise CodegenError(
                    f"kernel {kernel!r}: buffer {acc.buffer!r} of shape {list(shape)} has more "
                    f"than 2**63 - 1 elements; its indices would overflow 64 bits"
                )
        domain = parse_set(stmt.domain)
        if domain.is_empty():
            continue
        for d in range(domain.dim(isl.dim_type.set)):
            for bound in (domain.dim_min_val(d), domain.dim_max_val(d)):
                if domain.dim(isl.dim_type.param) and not bound.is_int():
                    continue  # a parametric bound (see above)
                if not bound.is_int() or abs(int(bound.to_python())) > INDEX_LIMIT:
                    raise CodegenError(
                        f"kernel {kernel!r}: loop {domain.get_dim_name(isl.dim_type.set, d)} "
                        f"of {stmt.name} reaches {bound}, beyond 64-bit indices"
                    )


def _index(build: isl.AstBuild, index, shape, iterators: list[str]) -> Index:
    """Index expressions of a PwMultiAff (or one PwAff, for a dim value)."""
    pieces = (
        [index]
        if isinstance(index, isl.PwAff)
        else [index.get_pw_aff(r) for r in range(index.dim(isl.dim_type.out))]
    )
    steps_of = strides(shape) if shape is not None else (1,)
    exprs = tuple(build.expr_from_pw_aff(pa) for pa in pieces)
    offset = None
    if shape is not None and pieces and all(isinstance(s, int) for s in steps_of):
        offset = pieces[0].scale_val(isl.Val(steps_of[0]))
        for pa, stride in zip(pieces[1:], steps_of[1:], strict=True):
            offset = offset.add(pa.scale_val(isl.Val(stride)))
    steps = {name: _step(pieces, steps_of, offset, pos) for pos, name in enumerate(iterators)}
    flat = build.expr_from_pw_aff(offset) if offset is not None else None
    return Index(exprs, steps_of, steps, flat)


def _step(pieces, steps_of, offset, pos: int) -> int | None:
    """The flat element step along iterator ``pos``; None where it is not one fixed
    number (a parametric stride it moves along, or a floor)."""
    total: int | None = 0
    for pa, stride in zip(pieces, steps_of, strict=True):
        coeff = _coefficient(pa, pos)
        if coeff is None or (coeff and isinstance(stride, Poly)):
            total = None
            break
        total += coeff * stride if coeff else 0
    if total is None and offset is not None:
        total = _coefficient(offset, pos)
    return total


def _coefficient(pa: isl.PwAff, pos: int) -> int | None:
    if pa.n_piece() != 1:
        return None
    aff = pa.get_pieces()[0][1]
    for d in range(aff.dim(isl.dim_type.div)):
        if aff.get_coefficient_val(isl.dim_type.div, d).is_zero():
            continue  # a div that cancelled out
        if aff.get_div(d).involves_dims(isl.dim_type.in_, pos, 1):
            return None
    coeff = aff.get_coefficient_val(isl.dim_type.in_, pos)
    return int(coeff.to_python()) if coeff.is_int() else None  # 1/2: not a fixed step
