"""A scheduled kernel as readable pseudo-C: the loop nest the isl AST describes, with
loop iterators named after the statement dims they run over and marks as pragmas."""

from __future__ import annotations

import islpy as isl

from polyonnx.krnl.ir import (
    Binary,
    Buffer,
    Cast,
    Const,
    Expr,
    Extent,
    Iter,
    Load,
    LoadAt,
    Select,
    Unary,
)
from polyonnx.krnl.islutil import isl_callbacks
from polyonnx.schedule.astgen import Instance, KernelAst, build_ast
from polyonnx.schedule.tree import KernelSchedule

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<",
          "le": "<=", "gt": ">", "ge": ">=", "and": "&&", "or": "||", "mod": "%",
          "bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}  # fmt: skip
_REDUCE = {"add": "+=", "mul": "*="}


def pseudo_c(schedule: KernelSchedule, buffers: dict[str, Buffer], state=None) -> str:
    """``state`` (a schedule.state.State), when given, names loops after its loop names."""
    ast = build_ast(schedule, buffers)
    lines: list[str] = []
    _Printer(ast, lines, state if state is not None else schedule.state).node(ast.root, 0, {})
    return "\n".join(lines)


class _Printer:
    def __init__(self, ast: KernelAst, lines: list[str], state=None):
        self.ast = ast
        self.lines = lines
        self.state = state

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def node(self, node: isl.AstNode, depth: int, names: dict[str, str]) -> None:
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            kids = node.block_get_children()
            for i in range(kids.n_ast_node()):
                self.node(kids.get_at(i), depth, names)
        elif kind == isl.ast_node_type.for_:
            self.loop(node, depth, names)
        elif kind == isl.ast_node_type.if_:
            self.emit(depth, f"if ({self.expr(node.if_get_cond(), names)}) {{")
            self.node(node.if_get_then_node(), depth + 1, names)
            if node.if_has_else_node():
                self.emit(depth, "} else {")
                self.node(node.if_get_else_node(), depth + 1, names)
            self.emit(depth, "}")
        elif kind == isl.ast_node_type.mark:
            self.emit(depth, f"#pragma {node.mark_get_id().get_name()}")
            self.node(node.mark_get_node(), depth, names)
        elif kind == isl.ast_node_type.user:
            self.emit(depth, self.statement(self.instance(node), names))

    def loop(self, node: isl.AstNode, depth: int, names: dict[str, str]) -> None:
        iterator = node.for_get_iterator().get_id().get_name()
        names = {**names, iterator: self._loop_name(node, iterator, names)}
        name = names[iterator]
        init = self.expr(node.for_get_init(), names)
        cond = self.expr(node.for_get_cond(), names)
        inc = self.expr(node.for_get_inc(), names)
        step = f"{name}++" if inc == "1" else f"{name} += {inc}"
        self.emit(depth, f"for (int {name} = {init}; {cond}; {step})")
        self.node(node.for_get_body(), depth + 1, names)

    def _loop_name(self, node: isl.AstNode, iterator: str, names: dict[str, str]) -> str:
        """The schedule's name for this loop, or the statement dim it runs over."""
        taken = set(names.values())
        named = self._state_name(node, iterator)
        if named is not None and named not in taken:
            return named
        for inst in self._instances(node.for_get_body()):
            for dim, index in inst.dims.items():
                if _is_id(index.exprs[0], iterator) and dim not in taken:
                    return dim
        return iterator

    def _state_name(self, node: isl.AstNode, iterator: str) -> str | None:
        """Iterator cK is member K of the statement's nest (bands nest in loop order)."""
        if self.state is None or not iterator[1:].isdigit():
            return None
        position = int(iterator[1:])
        for inst in self._instances(node.for_get_body()):
            nest = next(n for n in self.state.nests if n.statement == inst.stmt.name)
            if position < len(nest.loops):
                return nest.loops[position].name
        return None

    def _instances(self, node: isl.AstNode) -> list[Instance]:
        found: list[Instance] = []

        def visit(n: isl.AstNode) -> bool:
            if n.get_type() == isl.ast_node_type.user:
                found.append(self.instance(n))
            return True

        with isl_callbacks("listing the statements of an AST") as guard:
            node.foreach_descendant_top_down(guard.descend(visit))
        return found

    def instance(self, node: isl.AstNode) -> Instance:
        return self.ast.instances[node.get_annotation().get_name()]

    def statement(self, inst: Instance, names: dict[str, str]) -> str:
        stmt = inst.stmt
        target = self.access(inst, stmt.write, names)
        value = self.value(stmt.expr, inst, names)
        if stmt.reduce in _REDUCE:
            return f"{target} {_REDUCE[stmt.reduce]} {value};"
        if stmt.reduce:
            return f"{target} = {stmt.reduce}({target}, {value});"
        return f"{target} = {value};"

    def access(self, inst: Instance, acc, names: dict[str, str]) -> str:
        index = inst.accesses[acc]
        subscript = "".join(f"[{self.expr(e, names)}]" for e in index.exprs)
        return f"{acc.buffer}{subscript}"

    def value(self, expr: Expr, inst: Instance, names: dict[str, str]) -> str:
        if isinstance(expr, Load):
            return self.access(inst, expr.access, names)
        if isinstance(expr, LoadAt):
            return expr.buffer + "".join(f"[{self.value(i, inst, names)}]" for i in expr.index)
        if isinstance(expr, Const):
            return repr(expr.value)
        if isinstance(expr, Extent):
            return f"{expr.buffer}.shape[{expr.axis}]"
        if isinstance(expr, Iter):
            return self.expr(inst.dims[expr.dim].exprs[0], names)
        if isinstance(expr, Unary):
            return f"{expr.op}({self.value(expr.x, inst, names)})"
        if isinstance(expr, Binary):
            a, b = self.value(expr.a, inst, names), self.value(expr.b, inst, names)
            if expr.op in _INFIX:
                return f"({a} {_INFIX[expr.op]} {b})"
            return f"{expr.op}({a}, {b})"
        if isinstance(expr, Select):
            parts = [self.value(e, inst, names) for e in (expr.cond, expr.a, expr.b)]
            return f"({parts[0]} ? {parts[1]} : {parts[2]})"
        if isinstance(expr, Cast):
            return f"({expr.dtype}){self.value(expr.x, inst, names)}"
        return repr(expr)

    def expr(self, e: isl.AstExpr, names: dict[str, str]) -> str:
        """An isl AST expression as C, parenthesised where a nested operation needs it."""
        kind = e.get_type()
        if kind == isl.ast_expr_type.int:
            return str(e.get_val().to_python())
        if kind == isl.ast_expr_type.id:
            name = e.get_id().get_name()
            return names.get(name, name)
        args = []
        for i in range(e.op_get_n_arg()):
            arg = e.op_get_arg(i)
            text = self.expr(arg, names)
            if arg.get_type() == isl.ast_expr_type.op and _is_infix(arg.op_get_type()):
                text = f"({text})"
            args.append(text)
        return _ast_op_text(e.op_get_type(), args)


def _is_id(expr: isl.AstExpr, name: str) -> bool:
    return expr.get_type() == isl.ast_expr_type.id and expr.get_id().get_name() == name


def _infix() -> dict:
    t = isl.ast_expr_op_type
    return {t.add: "+", t.sub: "-", t.mul: "*", t.div: "/", t.pdiv_q: "/", t.pdiv_r: "%",
             t.zdiv_r: "%", t.eq: "==", t.le: "<=", t.lt: "<", t.ge: ">=", t.gt: ">",
             t.and_: "&&", t.and_then: "&&", t.or_: "||", t.or_else: "||"}  # fmt: skip


def _is_infix(op) -> bool:
    return op in _infix() or op == isl.ast_expr_op_type.minus


def _ast_op_text(op, args: list[str]) -> str:
    t = isl.ast_expr_op_type
    infix = _infix()
    if op in infix:
        return f"{args[0]} {infix[op]} {args[1]}" if len(args) == 2 else f"({args[0]})"
    if op == t.minus:
        return f"-{args[0]}"
    if op == t.fdiv_q:
        return f"floord({args[0]}, {args[1]})"
    if op in (t.min, t.max):
        name = "min" if op == t.min else "max"
        return f"{name}({', '.join(args)})"
    if op in (t.cond, t.select):
        return f"({args[0]} ? {args[1]} : {args[2]})"
    return f"op{op}({', '.join(args)})"
