"""One scheduled kernel → one LLVM function, by walking its isl AST.

Loops become i64 phi loops. A loop under a ``vectorize`` mark is emitted as explicit
``<W x T>`` code stepping by W, then the tail: one masked vector step when every access
can be masked (:meth:`_KernelWalker._maskable`), else a scalar loop. Along the vector loop
each access is classified by its flat stride: 1 → vector load/store, 0 → scalar load and
splat (or, for a reduction's write, a vector accumulator reduced once after the loop),
2..MAX_STRIDE (a strided pool's taps) → one load of the span and a shuffle of every
step-th lane, anything else → one scalar access per lane.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl
from llvmlite import ir

from polyonnx.emit import ops, smallfloat, threads, transpose
from polyonnx.emit.llvmtypes import (
    I64,
    PTR,
    call_overloaded,
    constant,
    intrinsic,
    mangle,
    memory_type,
    no_unroll,
    splat,
)
from polyonnx.emit.smallfloat import SMALL_DTYPES
from polyonnx.emit.ukernel import Gemm, emit_gemm_call
from polyonnx.errors import CodegenError
from polyonnx.krnl.ir import (
    REDUCE_OPS,
    Binary,
    Buffer,
    Cast,
    Checked,
    Const,
    Expr,
    Extent,
    Iter,
    Load,
    LoadAt,
    Select,
    Unary,
    checks,
    children,
    loads,
    reduce_identity,
)
from polyonnx.krnl.params import Dim, Poly, strides
from polyonnx.schedule.astgen import Index, Instance, KernelAst, build_ast, kernel_parameters
from polyonnx.schedule.gemm import Params, geometry, is_ukernel_mark
from polyonnx.schedule.heuristics.nest import MAX_STRIDE
from polyonnx.schedule.state import PARALLEL, TRANSPOSE
from polyonnx.schedule.tree import VECTORIZE, KernelSchedule

Env = dict[str, ir.Value]
I32 = ir.IntType(32)
ERRORS = "\0errors"
"""The key of the error record's pointer among a kernel's buffer pointers: the last
parameter of a kernel with run-time checks (see :func:`has_checks`)."""
PARAMS = "\0params"
"""The key of the int64 values of a parametric kernel's isl parameters (krnl/params.py),
the argument after its buffers."""
ROLLED_STEPS = 8
"""A loop of steps of INTERLEAVE vectors with at least this many steps (or an unknown
count) is marked for LLVM not to unroll it. Unrolled whole, a Softmax row's sum over 1024
floats (16 steps) kept its 64 loaded vectors live into the next pass over the same row,
which LLVM then read from them: 40 registers' worth spilled to the stack. Rows of 128
(two steps) stay unrolled. The measurements are in docs/measurements.md."""
INTERLEAVE = 4
"""Vectors a step of a contiguous vector loop computes before the one-vector steps: the
instructions of four independent vectors interleaved, as one LLVM vector four registers
wide. A long dependence chain per vector (exp, tanh: some twenty instructions) otherwise
fills the FP scheduler before the next vector starts; a reduction gets four accumulators.
The measurements are in docs/measurements.md."""


@dataclass(frozen=True)
class Lanes:
    """Vector context: the loop iterator whose iterations fill the ``width`` lanes; in a
    masked tail, ``count`` (i64, 0 < count < width) lanes are active and ``mask`` holds
    them."""

    iterator: str
    width: int
    count: ir.Value | None = None
    mask: ir.Value | None = None


def emit_kernel(
    module: ir.Module,
    name: str,
    schedule: KernelSchedule,
    buffers: Mapping[str, Buffer],
    width: int,
    *,
    checks: bool = True,
) -> ir.Function:
    """Define ``void name(ptr noalias %buf...)`` with one pointer per buffer the kernel uses,
    in ``schedule.buffers()`` order, then, for a kernel with run-time checks, the error
    record's (``i64 [site, value]``, written only when a check fails). Without ``checks``
    a Checked is its value alone: no test, no record."""
    params = kernel_parameters(schedule.kernel.statements)
    names = (
        *schedule.buffers(),
        *((PARAMS,) if params else ()),
        *((ERRORS,) if has_checks(schedule, checks) else ()),
    )
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * len(names)), name)
    for arg, buf in zip(fn.args, names, strict=True):
        arg.add_attribute("noalias")
        arg.name = "buf_" + "".join(c if c.isalnum() else "_" for c in buf)[:40]
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    ast = build_ast(schedule, dict(buffers))
    pointers = dict(zip(names, fn.args, strict=True))
    walker = _KernelWalker(builder, ast, pointers, buffers, width, checks=checks)
    walker.panels = dict(schedule.panels)
    walker.gemms = schedule.gemms
    walker.node(ast.root, _parameter_values(builder, pointers.get(PARAMS), params))
    builder.ret_void()
    return fn


def _parameter_values(b: ir.IRBuilder, values: ir.Value | None, names) -> Env:
    """The isl parameters' values, read from the int64 array a parametric kernel takes
    after its buffers (in :func:`kernel_parameters` order)."""
    env = {}
    for i, name in enumerate(names):
        at = b.gep(values, [ir.Constant(I64, i)], inbounds=True, source_etype=I64)
        env[name] = b.load(at, typ=I64)
    return env


def kernel_arguments(schedule: KernelSchedule, checks: bool = True) -> int:
    """How many pointers the kernel's function takes: buffers, the parameters' values
    (a parametric kernel), the error record (a kernel with checks)."""
    params = bool(kernel_parameters(schedule.kernel.statements))
    return len(schedule.buffers()) + params + has_checks(schedule, checks)


def has_checks(schedule: KernelSchedule, enabled: bool = True) -> bool:
    """Whether the kernel's code checks values at run time (``enabled``, and a Checked in
    a statement): then it takes the error record's pointer after its buffers'."""
    return enabled and any(checks(stmt.expr) for stmt in schedule.kernel.statements)


class _KernelWalker:
    def __init__(
        self, builder: ir.IRBuilder, ast: KernelAst, pointers, buffers, width: int, *, checks=True
    ):
        self.b = builder
        self.ast = ast
        self.pointers = pointers
        self.buffers = buffers
        self.width = width
        self.panels: dict[str, str] = {}
        """B -> its panel copy (KernelSchedule.panels)."""
        self.gemms: tuple = ()
        """A parametric kernel's fitted contractions (KernelSchedule.gemms)."""
        self.checked: dict[Checked, ir.Value] = {}
        """The checks of the statement being evaluated, emitted (see :meth:`check`)."""
        self.checks = checks
        """Whether a Checked is tested, or only its value emitted."""

    # ---- AST nodes ------------------------------------------------------------------

    def node(self, node: isl.AstNode, env: Env) -> None:
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            for child in _children(node):
                self.node(child, env)
        elif kind == isl.ast_node_type.for_:
            self.loop(node, env, self.expr(node.for_get_init(), env))
        elif kind == isl.ast_node_type.if_:
            self.branch(node, env)
        elif kind == isl.ast_node_type.mark:
            self.mark(node, env)
        elif kind == isl.ast_node_type.user:
            self.user(node, env, None)
        else:
            raise CodegenError(f"unexpected isl AST node {node.to_C_str()}")

    def mark(self, node: isl.AstNode, env: Env) -> None:
        child = node.mark_get_node()
        mark = node.mark_get_id().get_name()
        if mark == VECTORIZE and self._vectorizable(child):
            self.vector_loop(child, env)
        elif mark == PARALLEL and self._bounded_unit_loop(child):
            self.parallel_loop(child, env)
        elif is_ukernel_mark(mark):
            self.ukernel(child, env, Params.from_mark(mark))
        elif mark == TRANSPOSE and (tile := transpose.tile_of(self, child)) is not None:
            transpose.emit(self, tile, env)
        else:
            self.node(child, env)

    def ukernel(self, node: isl.AstNode, env: Env, params: Params) -> None:
        """The contraction under the mark as packed GEMM (emit/ukernel.py), for the values
        of the outer dims the enclosing loops give."""
        under = self._instances_under(node)
        fitted = {g.statement: g for g in self.gemms}
        found = [(i, self._view(i, fitted)) for i in under]
        found = [(i, g) for i, g in found if g is not None]
        if not found:
            names = sorted(i.stmt.name for i in under)
            raise CodegenError(f"ukernel mark over {names}: none is a contraction")
        inst, geo = found[0]
        outer = {d: self.expr(inst.dims[geo.dims[d]].exprs[0], env) for d in geo.outer}
        names = {i.stmt.name for i in under} - {inst.stmt.name}
        order = list(self.ast.statements)
        position = order.index(inst.stmt)
        before = [s for s in order[:position] if s.name in names]
        after = tuple(s for s in order[position + 1 :] if s.name in names)
        panels = self.panels.get(geo.b.buffer)
        gemm = Gemm(
            geo, params, inst.stmt, before[-1] if before else None, after, panels,
            fitted.get(inst.stmt.name),
        )  # fmt: skip
        emit_gemm_call(
            self.b, gemm, self.width, self.pointers, outer, self.buffers,
            count=lambda n: self._count(n, env),
        )  # fmt: skip

    def _view(self, inst: Instance, fitted):
        """The GEMM view of a statement: a parametric kernel's are fitted (its
        KernelSchedule.gemms), and its other statements have none."""
        if fitted:
            return fitted[inst.stmt.name].geo if inst.stmt.name in fitted else None
        return geometry(inst.stmt, self.buffers)

    def _instances_under(self, node: isl.AstNode) -> list[Instance]:
        """The statement instances of the user nodes in this subtree (its own copies: isl
        may have generated the subtree more than once)."""
        kind = node.get_type()
        if kind == isl.ast_node_type.user:
            return [self.instance(node)]
        if kind == isl.ast_node_type.for_:
            return self._instances_under(node.for_get_body())
        if kind == isl.ast_node_type.mark:
            return self._instances_under(node.mark_get_node())
        if kind == isl.ast_node_type.if_:
            found = self._instances_under(node.if_get_then_node())
            if node.if_has_else_node():
                found += self._instances_under(node.if_get_else_node())
            return found
        return [i for child in _children(node) for i in self._instances_under(child)]

    def _bounded_unit_loop(self, node: isl.AstNode) -> bool:
        if node.get_type() != isl.ast_node_type.for_:
            return False
        inc = node.for_get_inc()
        unit = inc.get_type() == isl.ast_expr_type.int and inc.get_val().to_python() == 1
        return unit and self.upper_bound(node) is not None

    def parallel_loop(self, node: isl.AstNode, env: Env) -> None:
        """Outline the loop body into ``body(ctx, lo, hi)`` and run its iterations through
        polyonnx_parallel_for; buffer pointers and outer iterators travel in ``ctx``."""
        bound, inclusive = self.upper_bound(node)
        start = self.expr(node.for_get_init(), env)
        ub = self.expr(bound, env)
        stop = self.b.add(ub, ir.Constant(I64, 1)) if inclusive else ub
        module = self.b.module
        body = ir.Function(
            module, threads.BODY_TYPE, f"{self.b.function.name}.par{len(module.globals)}"
        )
        free = [*self.pointers.items(), *env.items()]
        ctx = self.b.alloca(I64, ir.Constant(I64, max(len(free), 1)), "ctx")
        for k, (_, value) in enumerate(free):
            word = self.b.ptrtoint(value, I64) if isinstance(value.type, ir.PointerType) else value
            self.b.store(word, self.b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64))
        self._outline(body, node, free)
        self.b.call(threads.parallel_for(module), [body, ctx, start, stop])

    def _outline(self, fn: ir.Function, node: isl.AstNode, free) -> None:
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        ctx, lo, hi = fn.args
        words = [
            b.load(b.gep(ctx, [ir.Constant(I64, k)], source_etype=I64), typ=I64)
            for k in range(len(free))
        ]
        count = len(self.pointers)
        n_env = len(free) - count
        core = ir.Function(
            fn.module,
            ir.FunctionType(ir.VoidType(), [PTR] * count + [I64] * (n_env + 2)),
            fn.name + ".core",
        )
        for arg in core.args[:count]:
            arg.add_attribute("noalias")
        args = [b.inttoptr(w, PTR) for w in words[:count]] + words[count:] + [lo, hi]
        b.call(core, args)
        b.ret_void()
        cb = ir.IRBuilder(core.append_basic_block("entry"))
        pointers = {name: a for (name, _), a in zip(free[:count], core.args[:count], strict=True)}
        env = {name: a for (name, _), a in zip(free[count:], core.args[count:-2], strict=True)}
        inner = _KernelWalker(cb, self.ast, pointers, self.buffers, self.width, checks=self.checks)
        inner.panels = self.panels
        inner.gemms = self.gemms
        inner.loop(node, env, core.args[-2], last=core.args[-1])
        cb.ret_void()

    def branch(self, node: isl.AstNode, env: Env) -> None:
        cond = self.expr(node.if_get_cond(), env)
        if node.if_has_else_node():
            with self.b.if_else(cond) as (then, otherwise):
                with then:
                    self.node(node.if_get_then_node(), env)
                with otherwise:
                    self.node(node.if_get_else_node(), env)
        else:
            with self.b.if_then(cond):
                self.node(node.if_get_then_node(), env)

    def loop(
        self, node: isl.AstNode, env: Env, start: ir.Value, last: ir.Value | None = None
    ) -> None:
        """``for (it = start; cond; it += inc)`` as a phi loop (``it <= last`` instead of the
        AST's condition when ``last`` is given: a parallel chunk)."""
        name = node.for_get_iterator().get_id().get_name()
        step = self.expr(node.for_get_inc(), env)
        it, header, body, exit_ = self._open_loop(name, "", start)
        if last is None:
            cond = self.expr(node.for_get_cond(), {**env, name: it})
        else:
            cond = self.b.icmp_signed("<=", it, last)
        self.b.cbranch(cond, body, exit_)
        self.b.position_at_end(body)
        self.node(node.for_get_body(), {**env, name: it})
        it.add_incoming(self.b.add(it, step), self.b.block)
        self.b.branch(header)
        self.b.position_at_end(exit_)

    def _open_loop(self, name: str, kind: str, start: ir.Value):
        """A loop's i64 phi (starting at ``start``) and its header, body and exit blocks;
        the builder is left at the header."""
        pre = self.b.block
        header = self.b.append_basic_block(f"{name}.{kind}head")
        body = self.b.append_basic_block(f"{name}.{kind}body")
        exit_ = self.b.append_basic_block(f"{name}.{kind}exit")
        self.b.branch(header)
        self.b.position_at_end(header)
        it = self.b.phi(I64, f"{name}.{kind}" if kind else name)
        it.add_incoming(start, pre)
        return it, header, body, exit_

    # ---- vector loops -------------------------------------------------------------------

    def _vectorizable(self, node: isl.AstNode) -> bool:
        """A unit-step loop bounded by ``it <= ub`` or ``it < ub`` over straight-line
        statements, whose writes can be done a vector at a time."""
        if node.get_type() != isl.ast_node_type.for_ or self.width < 2:
            return False
        if (
            node.for_get_inc().get_type() != isl.ast_expr_type.int
            or node.for_get_inc().get_val().to_python() != 1
        ):
            return False
        if self.upper_bound(node) is None:
            return False
        users = self._users(node.for_get_body())
        if not users:
            return False
        name = node.for_get_iterator().get_id().get_name()
        reductions = [u for u in users if u.accesses[u.stmt.write].steps.get(name) == 0]
        if reductions:
            return len(users) == 1 and users[0].stmt.reduce in REDUCE_OPS
        return all(u.accesses[u.stmt.write].steps.get(name) is not None for u in users)

    def _users(self, node: isl.AstNode) -> list[Instance] | None:
        kind = node.get_type()
        if kind == isl.ast_node_type.user:
            return [self.instance(node)]
        if kind == isl.ast_node_type.block:
            found = []
            for child in _children(node):
                part = self._users(child)
                if part is None:
                    return None
                found += part
            return found
        return None

    def upper_bound(self, node: isl.AstNode) -> tuple[isl.AstExpr, bool] | None:
        """A loop's bound ``it <= ub`` or ``it < ub`` as (ub, whether ``<=``), else None
        (emit/transpose.py reads it too)."""
        cond = node.for_get_cond()
        name = node.for_get_iterator().get_id().get_name()
        if cond.get_type() != isl.ast_expr_type.op:
            return None
        kind = cond.op_get_type()
        if kind not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt):
            return None
        lhs = cond.op_get_arg(0)
        if lhs.get_type() != isl.ast_expr_type.id or lhs.get_id().get_name() != name:
            return None
        return cond.op_get_arg(1), kind == isl.ast_expr_op_type.le

    def vector_loop(self, node: isl.AstNode, env: Env) -> None:
        """Steps of ``INTERLEAVE`` vectors while they fit, then of one vector, then a
        masked vector step or the scalar tail loop."""
        name = node.for_get_iterator().get_id().get_name()
        bound, inclusive = self.upper_bound(node)
        ub = self.expr(bound, env)
        last = ub if inclusive else self.b.sub(ub, ir.Constant(I64, 1))
        users = self._users(node.for_get_body())
        reducing = _reducing(users, name)
        start = self.expr(node.for_get_init(), env)
        it, acc = start, None
        wide = self.width * INTERLEAVE
        count = _trip_count(node.for_get_init(), bound, inclusive)
        fits = count is None or count >= wide
        widths = [wide, self.width] if fits and self._interleavable(users, name) else [self.width]
        rolled = count is None or count >= ROLLED_STEPS * wide
        for width in widths:
            lanes = Lanes(name, width)
            it, acc = self._vector_steps(
                users, reducing, env, lanes, start=it, last=last, acc=acc, rolled=rolled
            )
        inner = {**env, name: it}
        if reducing is None and self._maskable(users, name):
            self.masked_tail(users, inner, Lanes(name, self.width), it, last)
            return
        if reducing is not None:
            dtype = self.buffers[reducing.stmt.write.buffer].dtype
            total = ops.reduce_lanes(self.b, reducing.stmt.reduce, acc, dtype)
            address = self.address(reducing, reducing.stmt.write, {**env, name: start})
            old = self._load_scalar(address, dtype)
            self._store_scalar(
                address, ops.combine(self.b, reducing.stmt.reduce, old, total, dtype), dtype
            )
        self.loop(node, env, it)

    def _vector_steps(
        self,
        users: list[Instance],
        reducing: Instance | None,
        env: Env,
        lanes: Lanes,
        *,
        start: ir.Value,
        last: ir.Value,
        acc: ir.Value | None,
        rolled: bool,
    ) -> tuple[ir.Value, ir.Value | None]:
        """A loop of steps of ``lanes.width`` iterations from ``start`` while a whole step
        fits before ``last``; returns where it stopped and, for ``reducing`` (a reduction
        along the loop), its accumulator vector (started from ``acc``, a wider one folded,
        or the identity). A ``rolled`` loop of steps of several vectors is marked for LLVM
        not to unroll (see ROLLED_STEPS)."""
        name, width = lanes.iterator, lanes.width
        init = None
        if reducing is not None:
            op = reducing.stmt.reduce
            dtype = self.buffers[reducing.stmt.write.buffer].dtype
            if acc is None:
                init = _identity(op, dtype, width)
            else:
                init = ops.fold_lanes(self.b, op, acc, width, dtype)
        pre = self.b.block
        it, header, body, exit_ = self._open_loop(name, "v", start)
        if init is not None:
            acc = self.b.phi(init.type, "acc")
            acc.add_incoming(init, pre)
        room = self.b.add(it, ir.Constant(I64, width - 1))
        self.b.cbranch(self.b.icmp_signed("<=", room, last), body, exit_)
        self.b.position_at_end(body)
        inner = {**env, name: it}
        if reducing is None:
            for inst in users:
                self.store(inst, inner, lanes)
        else:
            value = self.evaluate(reducing.stmt.expr, reducing, inner, lanes)
            acc.add_incoming(ops.combine(self.b, op, acc, value, dtype), self.b.block)
        it.add_incoming(self.b.add(it, ir.Constant(I64, width)), self.b.block)
        back = self.b.branch(header)
        if width > self.width and rolled:
            back.set_metadata("llvm.loop", no_unroll(self.b.module))
        self.b.position_at_end(exit_)
        return it, acc

    def _interleavable(self, users: list[Instance], name: str) -> bool:
        """Whether steps of several vectors may run first: every write and load contiguous
        along the loop or invariant in it, and no computed-index read (whose per-lane
        accesses would only grow)."""
        for inst in users:
            if inst.accesses[inst.stmt.write].steps.get(name) not in (0, 1):
                return False
            if _has_gather(inst.stmt.expr):
                return False
            for load in loads(inst.stmt.expr):
                if inst.accesses[load.access].steps.get(name) not in (0, 1):
                    return False
        return True

    def _maskable(self, users: list[Instance], name: str) -> bool:
        """Whether one masked vector step can do the tail: every write contiguous along
        the loop (or, not an update, a short stride: its active lanes stored one at a
        time; F(4x4)'s output tile columns on a 56x56 plane, 14 tiles a row, 0.69 ->
        0.47 ms at 64 channels), every load contiguous, loop-invariant or a short
        stride, and no computed-index read (whose lanes past the end could not be
        masked). An update in place (``y[i] += ...``) keeps the scalar tail: on Zen 4 a
        masked store does not forward to the next masked load of it, and a pool's taps
        update each row in turn (a 3x3 AveragePool on 14x14 planes ran 2.7x slower
        masked), unless it reads with a stride, whose scalar tail costs more still."""
        strided = False
        for inst in users:
            write = inst.accesses[inst.stmt.write].steps.get(name)
            if write != 1 and not (write and 1 < write <= MAX_STRIDE and not inst.stmt.reduce):
                return False
            if _has_gather(inst.stmt.expr):
                return False
            for load in loads(inst.stmt.expr):
                step = inst.accesses[load.access].steps.get(name)
                if step is None or not 0 <= step <= MAX_STRIDE:
                    return False
                strided = strided or step > 1
        return strided or all(inst.stmt.reduce is None for inst in users)

    def masked_tail(
        self, users: list[Instance], env: Env, lanes: Lanes, it: ir.Value, last: ir.Value
    ) -> None:
        """The last ``last - it + 1`` (< W) iterations as one vector step whose loads and
        stores are masked to them."""
        count = self.b.add(self.b.sub(last, it), ir.Constant(I64, 1))
        with self.b.if_then(self.b.icmp_signed(">", count, ir.Constant(I64, 0))):
            iota = ir.Constant(ir.VectorType(I64, lanes.width), list(range(lanes.width)))
            mask = self.b.icmp_signed("<", iota, splat(self.b, count, lanes.width))
            tail = Lanes(lanes.iterator, lanes.width, count, mask)
            for inst in users:
                self.store(inst, {**env, lanes.iterator: it}, tail)

    # ---- statements -------------------------------------------------------------------

    def instance(self, node: isl.AstNode) -> Instance:
        return self.ast.instances[node.get_annotation().get_name()]

    def user(self, node: isl.AstNode, env: Env, lanes: Lanes | None) -> None:
        self.store(self.instance(node), env, lanes)

    def store(self, inst: Instance, env: Env, lanes: Lanes | None) -> None:
        stmt = inst.stmt
        dtype = self.buffers[stmt.write.buffer].dtype
        value = self.evaluate(stmt.expr, inst, env, lanes)
        if stmt.reduce is not None:
            value = ops.combine(
                self.b, stmt.reduce, self.load(inst, stmt.write, dtype, env, lanes), value, dtype
            )
        index = inst.accesses[stmt.write]
        step = index.steps.get(lanes.iterator) if lanes else None
        address = self.address(inst, stmt.write, env)
        if lanes is None:
            self._store_scalar(address, value, dtype)
        elif step == 1 and lanes.mask is not None:
            _masked_store(self.b, _to_memory(self.b, value, dtype), address, lanes.mask, dtype)
        elif step == 1:
            self.b.store(_to_memory(self.b, value, dtype), address, align=_align(dtype))
        else:  # a lane at a time; in a masked tail, the active lanes (lane 0 always is)
            for lane in range(lanes.width):
                element = self.b.extract_element(value, ir.Constant(ir.IntType(32), lane))
                address = self._lane_address(inst, stmt.write, env, lanes, lane)
                if lanes.count is None or lane == 0:
                    self._store_scalar(address, element, dtype)
                    continue
                with self.b.if_then(self.b.icmp_signed("<", ir.Constant(I64, lane), lanes.count)):
                    self._store_scalar(address, element, dtype)

    def evaluate(self, expr: Expr, inst: Instance, env: Env, lanes: Lanes | None) -> ir.Value:
        """A statement's expression at one point (or one vector of points)."""
        self.checked = {}
        return self.value(expr, inst, env, lanes)

    def value(self, expr: Expr, inst: Instance, env: Env, lanes: Lanes | None) -> ir.Value:
        width = lanes.width if lanes else 1
        if isinstance(expr, Load):
            return self.load(inst, expr.access, expr.dtype, env, lanes)
        if isinstance(expr, LoadAt):
            return self.gather(expr, inst, env, lanes)
        if isinstance(expr, Checked) and not self.checks:
            return self.value(expr.x, inst, env, lanes)
        if isinstance(expr, Checked):
            return self.check(expr, inst, env, lanes)
        if isinstance(expr, Const):
            return constant(expr.dtype, expr.value, width)
        if isinstance(expr, Iter):
            return self.iterator(inst.dims[expr.dim], env, lanes)
        if isinstance(expr, Extent):
            size = self._count(self.buffers[expr.buffer].shape[expr.axis], env)
            return splat(self.b, size, width) if width > 1 else size
        if isinstance(expr, Unary):
            x = self.value(expr.x, inst, env, lanes)
            return ops.unary(self.b, expr.op, x, expr.x.dtype, expr.dtype)
        if isinstance(expr, Binary) and expr.op in ("max", "min"):
            operands = [self.value(x, inst, env, lanes) for x in _extremum_operands(expr)]
            return ops.extremum(self.b, expr.op, operands, expr.a.dtype)
        if isinstance(expr, Binary):
            a = self.value(expr.a, inst, env, lanes)
            c = self.value(expr.b, inst, env, lanes)
            return ops.binary(self.b, expr.op, a, c, expr.a.dtype)
        if isinstance(expr, Select):
            cond = self.value(expr.cond, inst, env, lanes)
            return self.b.select(
                cond, self.value(expr.a, inst, env, lanes), self.value(expr.b, inst, env, lanes)
            )
        if isinstance(expr, Cast):
            value = self.value(expr.x, inst, env, lanes)
            return ops.cast(self.b, value, expr.x.dtype, expr.dtype, expr.saturate)
        raise CodegenError(f"cannot emit expression {expr!r}")

    def gather(self, expr: LoadAt, inst: Instance, env: Env, lanes: Lanes | None) -> ir.Value:
        """A read at computed indices, clamped into the buffer; one load per lane."""
        shape = self.buffers[expr.buffer].shape
        offset = None
        width = lanes.width if lanes else 1
        for value, size, stride in zip(expr.index, shape, strides(shape), strict=True):
            index = self.value(value, inst, env, lanes)
            index = ops.cast(self.b, index, value.dtype, "int64")
            low = constant("int64", 0, width)
            high = self._count(size + -1 if isinstance(size, Poly) else max(size - 1, 0), env)
            high = splat(self.b, high, width) if width > 1 else high
            index = self.b.select(self.b.icmp_signed("<", index, low), low, index)
            index = self.b.select(self.b.icmp_signed(">", index, high), high, index)
            step = self._count(stride, env)
            term = self.b.mul(index, splat(self.b, step, width) if width > 1 else step)
            offset = term if offset is None else self.b.add(offset, term)
        if offset is None:
            offset = constant("int64", 0, lanes.width if lanes else 1)
        etype = memory_type(expr.dtype)
        pointer = self.pointers[expr.buffer]
        if lanes is None:
            address = self.b.gep(pointer, [offset], inbounds=True, source_etype=etype)
            return self._load_scalar(address, expr.dtype)
        values = []
        for lane in range(lanes.width):
            at = self.b.extract_element(offset, ir.Constant(ir.IntType(32), lane))
            address = self.b.gep(pointer, [at], inbounds=True, source_etype=etype)
            values.append(self._load_scalar(address, expr.dtype))
        return _gather_vector(self.b, values)

    def check(self, expr: Checked, inst: Instance, env: Env, lanes: Lanes | None) -> ir.Value:
        """``expr.x``, after one test of ``expr.ok`` over every (active) lane and a rarely
        taken branch that records the site and the first failing lane's value; once per
        evaluation of a statement, however often the check occurs in it (a wrapped index
        uses its value twice), since code after the branch is dominated by it."""
        if expr in self.checked:
            return self.checked[expr]
        x = self.checked[expr] = self.value(expr.x, inst, env, lanes)
        bad = self.b.not_(self.value(expr.ok, inst, env, lanes))
        if lanes is not None and lanes.mask is not None:
            bad = self.b.and_(bad, lanes.mask)
        wide = ops.cast(self.b, x, expr.x.dtype, "int64")
        width = lanes.width if lanes else 1
        if width == 1:
            failed = bad
        else:
            bits = self.b.bitcast(bad, ir.IntType(width))
            failed = self.b.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(width), 0))
        with self.b.if_then(failed, likely=False):
            if width > 1:
                first = call_overloaded(self.b, "cttz", [bits, ir.Constant(ir.IntType(1), 1)])
                lane = self.b.zext(first, I64) if width < 64 else first
                wide = self.b.extract_element(wide, lane)
            _record(self.b, self.pointers[ERRORS], expr.site.id, wide)
        return x

    def iterator(self, index: Index, env: Env, lanes: Lanes | None) -> ir.Value:
        base = self.expr(index.exprs[0], env)
        if lanes is None:
            return base
        step = index.steps.get(lanes.iterator)
        if step is None:
            values = [
                self.expr(index.exprs[0], self._lane_env(env, lanes, lane))
                for lane in range(lanes.width)
            ]
            return _gather_vector(self.b, values)
        offsets = ir.Constant(
            ir.VectorType(I64, lanes.width), [step * lane for lane in range(lanes.width)]
        )
        return self.b.add(splat(self.b, base, lanes.width), offsets)

    def load(self, inst: Instance, acc, dtype: str, env: Env, lanes: Lanes | None) -> ir.Value:
        step = inst.accesses[acc].steps.get(lanes.iterator) if lanes else None
        if lanes is None or step == 0:
            scalar = self._load_scalar(self.address(inst, acc, env), dtype)
            return splat(self.b, scalar, lanes.width) if lanes else scalar
        if step == 1 and lanes.mask is not None:
            address = self.address(inst, acc, env)
            raw = _masked_load(self.b, address, memory_type(dtype, lanes.width), lanes.mask, dtype)
            return _from_memory(self.b, raw, dtype, lanes.width)
        if step == 1:
            raw = self.b.load(
                self.address(inst, acc, env),
                typ=memory_type(dtype, lanes.width),
                align=_align(dtype),
            )
            return _from_memory(self.b, raw, dtype, lanes.width)
        if step is not None and 1 < step <= MAX_STRIDE:
            return self.strided_load(self.address(inst, acc, env), dtype, lanes, step)
        values = [
            self._load_scalar(self._lane_address(inst, acc, env, lanes, lane), dtype)
            for lane in range(lanes.width)
        ]
        return _gather_vector(self.b, values)

    def strided_load(self, address: ir.Value, dtype: str, lanes: Lanes, step: int) -> ir.Value:
        """Lanes ``address[0], address[step], ...``: one masked load of the span from the
        first lane's element to the last's (nothing past it is touched), then a shuffle of
        every step-th element (vpermt2ps on AVX-512, instead of W scalar loads)."""
        wide = step * lanes.width
        if lanes.count is None:
            span = step * (lanes.width - 1) + 1
            mask = ir.Constant(ir.VectorType(ir.IntType(1), wide), [j < span for j in range(wide)])
        else:  # lanes [0, count) active: elements [0, step * (count - 1)]
            end = self.b.mul(self.b.sub(lanes.count, ir.Constant(I64, 1)), ir.Constant(I64, step))
            iota = ir.Constant(ir.VectorType(I64, wide), list(range(wide)))
            mask = self.b.icmp_signed("<=", iota, splat(self.b, end, wide))
        raw = _masked_load(self.b, address, memory_type(dtype, wide), mask, dtype)
        picks = ir.Constant(ir.VectorType(I32, lanes.width), [step * j for j in range(lanes.width)])
        picked = self.b.shuffle_vector(raw, ir.Constant(raw.type, ir.Undefined), picks)
        return _from_memory(self.b, picked, dtype, lanes.width)

    # ---- addresses --------------------------------------------------------------------

    def address(self, inst: Instance, acc, env: Env) -> ir.Value:
        index = inst.accesses[acc]
        if index.flat is not None:
            offset = self.expr(index.flat, env)
        else:
            offset = ir.Constant(I64, 0)
            for expr, stride in zip(index.exprs, index.strides, strict=True):
                term = self.expr(expr, env)
                if stride != 1:
                    term = self.b.mul(term, self._count(stride, env))
                offset = self.b.add(offset, term)
        dtype = self.buffers[acc.buffer].dtype
        return self.b.gep(
            self.pointers[acc.buffer], [offset], inbounds=True, source_etype=memory_type(dtype)
        )

    def _lane_address(self, inst: Instance, acc, env: Env, lanes: Lanes, lane: int) -> ir.Value:
        return self.address(inst, acc, self._lane_env(env, lanes, lane))

    def _lane_env(self, env: Env, lanes: Lanes, lane: int) -> Env:
        return {**env, lanes.iterator: self.b.add(env[lanes.iterator], ir.Constant(I64, lane))}

    def _load_scalar(self, address: ir.Value, dtype: str) -> ir.Value:
        raw = self.b.load(address, typ=memory_type(dtype), align=_align(dtype))
        return _from_memory(self.b, raw, dtype, 1)

    def _store_scalar(self, address: ir.Value, value: ir.Value, dtype: str) -> None:
        self.b.store(_to_memory(self.b, value, dtype), address, align=_align(dtype))

    def _count(self, dim: Dim, env: Env) -> ir.Value:
        """An int64 size or stride: a constant, or a polynomial in the parameters."""
        if not isinstance(dim, Poly):
            return ir.Constant(I64, int(dim))
        total = ir.Constant(I64, 0)
        for mono, coeff in dim.terms:
            term = ir.Constant(I64, coeff)
            for name, power in mono:
                for _ in range(power):
                    term = self.b.mul(term, env[name])
            total = self.b.add(total, term)
        return total

    # ---- isl AST expressions (i64 index arithmetic) -------------------------------------

    def expr(self, e: isl.AstExpr, env: Env) -> ir.Value:
        kind = e.get_type()
        if kind == isl.ast_expr_type.int:
            return ir.Constant(I64, int(e.get_val().to_python()))
        if kind == isl.ast_expr_type.id:
            return env[e.get_id().get_name()]
        args = [e.op_get_arg(i) for i in range(e.op_get_n_arg())]
        return _ast_op(self.b, e.op_get_type(), [self.expr(a, env) for a in args])


def _record(b: ir.IRBuilder, errors: ir.Value, site: int, value: ir.Value) -> None:
    """Claim the error record for ``site`` if no check of this run has (a compare and
    exchange: lanes of the thread pool may fail at once), then write ``value`` beside it."""
    zero = ir.Constant(I64, 0)
    old = b.cmpxchg(errors, zero, ir.Constant(I64, site), "monotonic", "monotonic")
    with b.if_then(b.extract_value(old, 1)):
        b.store(value, b.gep(errors, [ir.Constant(I64, 1)], inbounds=True, source_etype=I64))


def _reducing(users: list[Instance], name: str) -> Instance | None:
    """The loop's user if it is a reduction along loop ``name`` (its write stays put)."""
    first = users[0]
    return first if first.accesses[first.stmt.write].steps.get(name) == 0 else None


def _trip_count(init: isl.AstExpr, bound: isl.AstExpr, inclusive: bool) -> int | None:
    """Iterations of a unit-step loop from ``init`` to ``bound`` when both are constants."""
    if init.get_type() != isl.ast_expr_type.int or bound.get_type() != isl.ast_expr_type.int:
        return None
    first, end = init.get_val().to_python(), bound.get_val().to_python()
    return max(end - first + (1 if inclusive else 0), 0)


def _children(node: isl.AstNode) -> list[isl.AstNode]:
    kids = node.block_get_children()
    return [kids.get_at(i) for i in range(kids.n_ast_node())]


def _ast_op(b: ir.IRBuilder, op, v: list[ir.Value]) -> ir.Value:
    t = isl.ast_expr_op_type
    zero = ir.Constant(I64, 0)
    if op == t.add:
        return b.add(v[0], v[1])
    if op == t.sub:
        return b.sub(v[0], v[1])
    if op == t.mul:
        return b.mul(v[0], v[1])
    if op == t.minus:
        return b.sub(zero, v[0])
    if op in (t.div, t.pdiv_q):
        return b.sdiv(v[0], v[1])
    if op in (t.pdiv_r, t.zdiv_r):
        return b.srem(v[0], v[1])
    if op == t.fdiv_q:  # floor division
        q = b.sdiv(v[0], v[1])
        inexact = b.icmp_signed("!=", b.mul(q, v[1]), v[0])
        negative = b.icmp_signed("<", b.xor(v[0], v[1]), zero)
        return b.sub(q, b.zext(b.and_(inexact, negative), I64))
    if op in (t.min, t.max):  # isl's min/max take any number of arguments
        pick = "<" if op == t.min else ">"
        best = v[0]
        for other in v[1:]:
            best = b.select(b.icmp_signed(pick, best, other), best, other)
        return best
    if op in (t.cond, t.select):
        return b.select(v[0], v[1], v[2])
    cmp = {t.eq: "==", t.le: "<=", t.lt: "<", t.ge: ">=", t.gt: ">"}.get(op)
    if cmp:
        return b.icmp_signed(cmp, v[0], v[1])
    if op in (t.and_, t.and_then):
        return b.and_(v[0], v[1])
    if op in (t.or_, t.or_else):
        return b.or_(v[0], v[1])
    raise CodegenError(f"unsupported isl AST operation {op}")


def _align(dtype: str) -> int:
    return {"float16": 2, "float64": 8, "int64": 8, "uint64": 8, "int32": 4, "uint32": 4,
            "float32": 4, "int16": 2, "uint16": 2}.get(dtype, 1)  # fmt: skip


def _from_memory(b: ir.IRBuilder, raw: ir.Value, dtype: str, width: int) -> ir.Value:
    if dtype in SMALL_DTYPES:
        return smallfloat.emit_decode(b, raw, dtype)
    if dtype != "bool":
        return raw
    return b.icmp_unsigned("!=", raw, constant("uint8", 0, width))


def _to_memory(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    if dtype in SMALL_DTYPES:
        return smallfloat.emit_encode(b, value, dtype, saturate=False)  # already rounded
    if dtype != "bool":
        return value
    width = value.type.count if isinstance(value.type, ir.VectorType) else 1
    return b.zext(value, memory_type("bool", width))


def _has_gather(expr: Expr) -> bool:
    return isinstance(expr, LoadAt) or any(_has_gather(c) for c in children(expr))


def _masked_load(
    b: ir.IRBuilder, address: ir.Value, vec: ir.VectorType, mask: ir.Value, dtype: str
) -> ir.Value:
    """``llvm.masked.load``: the masked-off lanes are zero and never touched in memory."""
    fn = intrinsic(b.module, f"llvm.masked.load.{mangle(vec)}.p0", vec, [PTR, I32, mask.type, vec])
    zero = ir.Constant(vec, None)
    return b.call(fn, [address, ir.Constant(I32, _align(dtype)), mask, zero])


def _masked_store(
    b: ir.IRBuilder, value: ir.Value, address: ir.Value, mask: ir.Value, dtype: str
) -> None:
    fn = intrinsic(
        b.module,
        f"llvm.masked.store.{mangle(value.type)}.p0",
        ir.VoidType(),
        [value.type, PTR, I32, mask.type],
    )
    b.call(fn, [value, address, ir.Constant(I32, _align(dtype)), mask])


def _gather_vector(b: ir.IRBuilder, values: list[ir.Value]) -> ir.Value:
    vec = ir.Constant(ir.VectorType(values[0].type, len(values)), ir.Undefined)
    for lane, v in enumerate(values):
        vec = b.insert_element(vec, v, ir.Constant(ir.IntType(32), lane))
    return vec


def _identity(op: str, dtype: str, width: int) -> ir.Constant:
    return constant(dtype, reduce_identity(op, dtype), width)


def _extremum_operands(expr: Binary) -> list[Expr]:
    """The operands of a tree of one max (or min) over one dtype: ``max(max(a, b), c)``
    gives [a, b, c]."""
    found = []
    for x in (expr.a, expr.b):
        same = isinstance(x, Binary) and x.op == expr.op and x.a.dtype == expr.a.dtype
        found += _extremum_operands(x) if same else [x]
    return found
