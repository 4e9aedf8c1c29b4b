"""Tuning tasks: the distinct kernels of a model, and each kernel as a program of its own.

Two kernels with the same structure (statements, domains, accesses, buffer shapes and
dtypes — everything but names) compile to the same code, so they are one task, tuned once:
ResNet-50's 58 kernels are 33 tasks. A task's hash keys its records in the database. The
hash covers the kernel's default schedule too: a record says how much faster a trace ran
than the default of its day, so once polyonnx's default for a kernel changes, the records
measured against the old one no longer apply (they may be slower than the new default).

    tasks = model_tasks(program)               # largest first once shares are known
    sub = kernel_program(program, kernel)      # the kernel alone: its reads are inputs
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from polyonnx.krnl.ir import (
    Access,
    Extent,
    Kernel,
    LoadAt,
    Program,
    map_expr,
    map_loads,
    renamed,
)
from polyonnx.schedule.heuristics.default import default_schedule
from polyonnx.schedule.tree import KernelSchedule


@dataclass(frozen=True)
class Task:
    """One distinct kernel structure and the kernels of the model that have it."""

    hash: str
    op_type: str
    kernels: tuple[str, ...]
    """Names of the model's kernels with this structure, in execution order."""

    @property
    def name(self) -> str:
        """The first kernel's name (how reports show the task)."""
        return self.kernels[0]


def structural_hash(kernel: Kernel, program: Program, default: KernelSchedule | None = None) -> str:
    """A hex digest of ``kernel`` with every name replaced by its position: statements
    S0, S1, ... and buffers b0, b1, ... in first-use order, plus each buffer's shape and
    dtype and whether it is a constant (a constant's values do not change the code), and
    its default schedule's tree (``default``, computed when not given)."""
    if default is None:
        default = default_schedule(kernel, program.buffers)
    buffers = {name: f"b{i}" for i, name in enumerate(kernel.buffers())}
    parts = [kernel.op_type, default.tree]
    for i, stmt in enumerate(kernel.statements):
        stmt = renamed(stmt, f"S{i}")
        stmt = dataclasses.replace(
            stmt,
            write=Access(buffers[stmt.write.buffer], stmt.write.index),
            expr=_rename_buffers(stmt.expr, buffers),
        )
        parts.append(repr(stmt))
    for name, alias in buffers.items():
        buf = program.buffers[name]
        parts.append(f"{alias}:{buf.shape}:{buf.dtype}:{name in program.constants}")
    text = "\n".join(parts)
    for i, stmt in enumerate(kernel.statements):  # dims named after statements, if any
        text = re.sub(rf"\b{re.escape(stmt.name)}\b", f"S{i}", text)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _rename_buffers(expr, buffers: Mapping[str, str]):
    def rename(node):
        if isinstance(node, LoadAt | Extent):
            return dataclasses.replace(node, buffer=buffers[node.buffer])
        return node

    expr = map_loads(
        expr,
        lambda ld: dataclasses.replace(
            ld, access=Access(buffers[ld.access.buffer], ld.access.index)
        ),
    )
    return map_expr(expr, rename)


def model_tasks(program: Program) -> list[Task]:
    """The program's kernels grouped by structure, in order of first appearance."""
    grouped: dict[str, list[Kernel]] = {}
    for kernel in program.kernels:
        grouped.setdefault(structural_hash(kernel, program), []).append(kernel)
    return [
        Task(digest, kernels[0].op_type, tuple(k.name for k in kernels))
        for digest, kernels in grouped.items()
    ]


def kernel_program(program: Program, kernel: Kernel) -> Program:
    """``kernel`` as a program of its own: what it reads (but does not write) are inputs,
    except constants, which keep their values; what it writes are outputs."""
    written = kernel.writes()
    used = kernel.buffers()
    constants = {n: program.constants[n] for n in used if n in program.constants}
    inputs = tuple(n for n in used if n not in written and n not in constants)
    outputs = tuple(n for n in used if n in written)
    return Program(
        kernels=(kernel,),
        buffers=MappingProxyType({n: program.buffers[n] for n in used}),
        inputs=inputs,
        outputs=outputs,
        constants=MappingProxyType(constants),
    )


def rename_trace(trace: Sequence[Mapping], kernel: str) -> list[dict]:
    """``trace`` (tuned on a kernel of the same structure) with its steps naming
    ``kernel``."""
    return [{**dict(step), "kernel": kernel} for step in trace]
