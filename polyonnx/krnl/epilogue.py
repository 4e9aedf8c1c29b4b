"""Epilogue fusion: elementwise kernels that follow a contraction become statements of it.

    mm:   T = 0;  T += A * B            mm:   Y = 0;  Y += A * B
    add:  U = T + bias          ==>           Y = Y + bias      (epilogue statements,
    relu: Y = max(U, 0)                       Y = max(Y, 0)      element for element)

A following kernel is absorbed when it is one statement without reduction that writes a
buffer of the contraction output's shape and dtype at the identity index, reads that
output only at the identity index, and nothing else reads the output (nor is it a graph
output or a view). The contraction then accumulates straight into the final buffer and
the epilogue statements rewrite each element in place; the ukernel schedule computes them
in the register tile before the one store (schedule/gemm_epilogue.py), any other schedule runs
them as loops after the contraction. The intermediate buffers disappear.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from polyonnx.krnl.ir import Kernel, Program, Statement, gathers, loads, map_loads, renamed
from polyonnx.krnl.islutil import is_whole_identity


def fuse_epilogues(program: Program, is_contraction, keep: frozenset[str] = frozenset()) -> Program:
    """``program`` with element-wise consumers absorbed into the kernels for which
    ``is_contraction(kernel)`` holds; the kernels named in ``keep`` (scripted ones)
    neither absorb nor are absorbed."""
    kernels = list(program.kernels)
    out: list[Kernel] = []
    dropped: set[str] = set()
    index = 0
    while index < len(kernels):
        host = kernels[index]
        index += 1
        if host.name not in keep and is_contraction(host):
            while index < len(kernels) and kernels[index].name not in keep:
                merged = _absorb(host, kernels[index], program, kernels)
                if merged is None:
                    break
                dropped.add(_output(host))
                host = merged
                index += 1
        out.append(host)
    buffers = {n: b for n, b in program.buffers.items() if n not in dropped}
    return dataclasses.replace(program, kernels=tuple(out), buffers=MappingProxyType(buffers))


def _output(kernel: Kernel) -> str | None:
    """What the kernel's last statement writes; the others may also fill temps it reads
    (a strided Conv's phase copy, krnl/ops/phases.py)."""
    return kernel.statements[-1].write.buffer if kernel.statements else None


def _absorb(host: Kernel, guest: Kernel, program: Program, kernels: list[Kernel]):
    t = _output(host)
    if t is None or len(guest.statements) != 1:
        return None
    stmt = guest.statements[0]
    u = stmt.write.buffer
    tb, ub = program.buffers[t], program.buffers.get(u)
    if ub is None or tb.shape != ub.shape or tb.dtype != ub.dtype or stmt.reduce is not None:
        return None
    if t in program.outputs or program.shares_storage(t):
        return None
    if u in program.views or u in program.views.values() or u in program.inputs:
        return None
    if any(g.buffer == t for g in gathers(stmt.expr)) or u in host.reads():
        return None
    if any(t in k.reads() for k in kernels if k is not guest):
        return None
    if not is_whole_identity(stmt, stmt.write.index, tb.shape):
        return None
    reads = [ld for ld in loads(stmt.expr) if ld.access.buffer == t]
    if not reads or not all(is_whole_identity(stmt, ld.access.index, tb.shape) for ld in reads):
        return None
    if any(ld.access.buffer == u for ld in loads(stmt.expr)):
        return None
    name = f"S{len(host.statements)}"
    tail = renamed(stmt, name)
    tail = dataclasses.replace(
        tail,
        expr=map_loads(
            tail.expr,
            lambda ld: (
                dataclasses.replace(ld, access=dataclasses.replace(ld.access, buffer=u))
                if ld.access.buffer == t
                else ld
            ),
        ),
    )
    head = tuple(_retarget(s, t, u) for s in host.statements)
    return Kernel(host.name, host.op_type, (*head, tail))


def _retarget(stmt: Statement, old: str, new: str) -> Statement:
    """``stmt`` writing (and reading) ``new`` where it used ``old``."""

    def swap(ld):
        if ld.access.buffer != old:
            return ld
        return dataclasses.replace(ld, access=dataclasses.replace(ld.access, buffer=new))

    write = stmt.write
    if write.buffer == old:
        write = dataclasses.replace(write, buffer=new)
    return dataclasses.replace(stmt, write=write, expr=map_loads(stmt.expr, swap))
