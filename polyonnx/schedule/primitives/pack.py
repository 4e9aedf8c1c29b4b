"""pack(buffer, at=loop): copy the part of ``buffer`` that the loops inside ``loop`` read
into a contiguous scratch buffer, once per iteration of ``loop``, and read the scratch
instead. With B[k, j] read under a 32-wide tile of j:

    for j_o:                                for j_o:
      for k / for j_i:          becomes       for k / for j_i: B_pack[k][j_i] = B[k][32*j_o + j_i]
        ... B[k][32*j_o + j_i]                for k / for j_i:
                                                ... B_pack[k][j_i]

The copied region is the box, computed by isl, that bounds what one iteration reads
(clipped to the buffer); its offset is an affine function of the outer loops.
"""

from __future__ import annotations

import re
from dataclasses import replace
from types import MappingProxyType

import islpy as isl

from polyonnx.errors import ScheduleError
from polyonnx.krnl.ir import Access, Buffer, Expr, Kernel, Load, Statement, loads, map_loads
from polyonnx.krnl.islutil import named_access, parse_access, visit
from polyonnx.schedule.state import Nest, State, Var, time_map


def pack(state: State, buffers: dict[str, Buffer], buffer: str, loop: str) -> State:
    readers = [
        s
        for s in state.kernel.statements
        if any(ld.access.buffer == buffer for ld in loads(s.expr))
    ]
    consumers = [s for s in readers if loop in state.nest(s.name).names()]
    if len(consumers) != 1:
        where = ", ".join(s.name for s in readers) or "no statement"
        raise ScheduleError(
            f"pack({buffer!r}, at={loop}): exactly one statement under {loop} must read "
            f"{buffer!r}; readers: {where}"
        )
    if any(s.write.buffer == buffer for s in state.kernel.statements):
        raise ScheduleError(
            f"pack({buffer!r}, at={loop}): the kernel writes {buffer!r}; only inputs can be packed"
        )
    consumer = consumers[0]
    if state.host(consumer.name) is not None or any(
        state.host(s) == consumer.name for s in state.attach
    ):
        raise ScheduleError(
            f"pack({buffer!r}, at={loop}): {consumer.name} is fused; pack before fusing"
        )
    nest = state.nest(consumer.name)
    depth = nest.position(loop)
    prefix = time_map(consumer, nest).project_out(
        isl.dim_type.out, depth + 1, len(nest.loops) - depth - 1
    )
    access = next(ld.access for ld in loads(consumer.expr) if ld.access.buffer == buffer)
    footprint = prefix.reverse().apply_range(named_access(access, "B"))
    shape = buffers[buffer].shape
    lows, sizes = [], []
    for r in range(len(shape)):
        only = footprint.project_out(isl.dim_type.out, r + 1, len(shape) - r - 1)
        only = only.project_out(isl.dim_type.out, 0, r)
        lows.append(_expression(isl.PwMultiAff.from_map(only.lexmin()), "p"))
        deltas = only.reverse().apply_range(only).deltas()
        sizes.append(int(deltas.dim_max_val(0).to_python()) + 1)
    name = _fresh(state, "P_" + re.sub(r"\W", "_", buffer))
    scratch = Buffer(f"{buffer}.pack{len(state.scratch)}", tuple(sizes), buffers[buffer].dtype)
    copy = _copy_statement(name, prefix, depth, lows, sizes, shape, buffer, scratch)
    reader = _reroute(consumer, access, scratch, prefix, lows)
    statements = []
    for stmt in state.kernel.statements:
        statements += [copy, reader] if stmt.name == consumer.name else [stmt]
    kernel = Kernel(state.kernel.name, state.kernel.op_type, tuple(statements))
    p_dims = [f"p{q}" for q in range(depth + 1)]
    t_dims = [f"t{r}" for r in range(len(shape))]
    loops = [Var(nest.loops[q].name, p_dims[q]) for q in range(depth + 1)]
    loops += [Var(f"{name}_{t}", t) for t in t_dims]
    nests = []
    for n in state.nests:
        if n.statement == consumer.name:
            nests.append(Nest(name, tuple(loops)))
        nests.append(n)
    attach = {**state.attach, name: (consumer.name, depth)}
    return replace(
        state, kernel=kernel, nests=tuple(nests), attach=MappingProxyType(attach),
        scratch=MappingProxyType({**state.scratch, scratch.name: scratch}),
    )  # fmt: skip


def _copy_statement(name, prefix: isl.Map, depth, lows, sizes, shape, buffer, scratch) -> Statement:
    p_dims = [f"p{q}" for q in range(depth + 1)]
    t_dims = [f"t{r}" for r in range(len(shape))]
    dims = ", ".join([*p_dims, *t_dims])
    tile = " and ".join(f"0 <= {t} < {n}" for t, n in zip(t_dims, sizes, strict=True))
    space = prefix.range().flat_product(isl.Set(f"{{ [{', '.join(t_dims)}] : {tile} }}"))
    for position, dim in enumerate([*p_dims, *t_dims]):
        space = space.set_dim_name(isl.dim_type.set, position, dim)
    clip = " and ".join(
        f"0 <= {lo} + {t} < {n}" for lo, t, n in zip(lows, t_dims, shape, strict=True)
    )
    domain = str(space.set_tuple_name(name).intersect(isl.Set(f"{{ {name}[{dims}] : {clip} }}")))
    source = ", ".join(f"{lo} + {t}" for lo, t in zip(lows, t_dims, strict=True))
    body = Load(scratch.dtype, Access(buffer, f"{{ {name}[{dims}] -> [{source}] }}"))
    write = Access(scratch.name, f"{{ {name}[{dims}] -> [{', '.join(t_dims)}] }}")
    return Statement(name, domain, write, body)


def _reroute(
    consumer: Statement, access: Access, scratch: Buffer, prefix: isl.Map, lows
) -> Statement:
    """The consumer reading the scratch at its old index minus the tile's offset."""
    p_dims = ", ".join(f"p{q}" for q in range(prefix.dim(isl.dim_type.out)))
    offsets = isl.MultiAff(f"{{ [{p_dims}] -> [{', '.join(lows)}] }}")
    read = isl.PwMultiAff.from_multi_aff(parse_access(access.index))
    shift = isl.PwMultiAff.from_multi_aff(offsets).pullback_pw_multi_aff(
        isl.PwMultiAff.from_map(prefix)
    )
    moved = read.sub(shift)
    pieces = [piece for _, piece in visit(moved, "foreach_piece")]
    if len(pieces) != 1:
        raise ScheduleError(f"pack: the packed index of {consumer.name} is not one affine map")
    index = re.sub(r"-> \w+\[", "-> [", str(pieces[0]))

    def swap(ld: Load) -> Expr:
        return Load(ld.dtype, Access(scratch.name, index)) if ld.access == access else ld

    return replace(consumer, expr=map_loads(consumer.expr, swap))


def _expression(pma: isl.PwMultiAff, prefix: str) -> str:
    pieces = [piece for _, piece in visit(pma, "foreach_piece")]
    if len(pieces) != 1:
        raise ScheduleError(
            "pack: the tile's offset is not one affine expression of the outer loops"
        )
    text = re.search(r"-> \[\((.*)\)\] \}$", str(pieces[0])).group(1)
    return _rename(text, prefix)


def _rename(text: str, prefix: str) -> str:
    """isl's anonymous dims print as i0, i1…: name them p0, p1…"""
    return re.sub(r"(?<![A-Za-z_])i(\d+)", lambda m: f"{prefix}{m.group(1)}", text)


def _fresh(state: State, name: str) -> str:
    taken = {s.name for s in state.kernel.statements}
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}{n}"
    return candidate
