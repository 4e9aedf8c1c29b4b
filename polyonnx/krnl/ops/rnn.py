"""Recurrent layers: RNN, GRU and LSTM (opsets 7–22), every direction, layout, optional
input and output of the ONNX spec.

The time recurrence is a loop-carried dependence, and the statements of one kernel run
one after another, each over its whole domain. So a node becomes ``seq_length + 2``
kernels, in order:

``init``  the state buffers ``H`` (and ``C``) get ``initial_h`` (``initial_c``) or 0.
          They are laid out as ``Y_h`` (``Y_c``) and *are* those outputs when requested.
``proj``  the input projection of every time step at once, one contraction::

              XW[t, d, b, g]  = Wb[d, g] + Rb[d, g]
              XW[t, d, b, g] += X[t, b, i] * W[d, g, i]

``step k`` for k = 0 … seq_length-1, one kernel covering every direction. Direction ``d``
          reads time ``t = k`` (forward) or ``t = seq_length-1-k`` (reverse); in a
          bidirectional node ``t = k + (seq_length-1-2k)·d``, an affine constraint of the
          statement domains ``S[t, d, b, …]``. The step accumulates the recurrent term into
          the pre-activations of its time slot, then updates the state from them in a few
          fused elementwise statements and writes ``Y``, e.g. for an RNN::

              XW[t, d, b, g] += H[d, b, r] * R[d, g, r]
              H[d, b, h]      = f(clip(XW[t, d, b, h]))
              Y[t, d, b, h]   = H[d, b, h]

          (GRU: 4–5 statements, LSTM: 4; see their functions.) Directions whose
          activations differ get one statement each (``d = 0``, ``d = 1``).

With ``sequence_lens`` every state update becomes ``valid ? new : old`` and every output
``valid ? H : 0``, with ``valid = t < sequence_lens[b]``: past a sequence's end its state
is held (``Y_h``/``Y_c`` are the last valid state, and a reverse pass starts from the
initial state at the sequence's own last element) and its outputs are 0.

float16 tensors are computed in float32 (scratch buffers too); the state is rounded to
float16 between steps, as it is stored in Y_h/Y_c.

Cost: one kernel per time step, so ``seq_length`` kernel calls per inference and compile
time linear in ``seq_length`` (about 0.05 s per step for an RNN, 0.1–0.15 s for a GRU
or LSTM, mostly LLVM's O3). The input projection is one large contraction for all
steps; each step's recurrent term is a small batched matrix-vector product.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Access, Expr, Iter, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers

# ---- activations ---------------------------------------------------------------------

ACTIVATIONS = {
    "relu": (False, False),
    "tanh": (False, False),
    "sigmoid": (False, False),
    "affine": (True, True),
    "leakyrelu": (True, False),
    "thresholdedrelu": (True, False),
    "scaledtanh": (True, True),
    "hardsigmoid": (True, True),
    "elu": (True, False),
    "softsign": (False, False),
    "softplus": (False, False),
}
"""Every activation the spec names, and whether it takes (alpha, beta)."""

DEFAULT_PARAMS = {
    "affine": (1.0, 0.0),
    "leakyrelu": (0.01, 0.0),
    "thresholdedrelu": (1.0, 0.0),
    "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5),
    "elu": (1.0, 0.0),
}
"""alpha/beta when the lists run out: the defaults of the ONNX operators of those names."""


@dataclass(frozen=True)
class Activation:
    name: str
    alpha: float = 0.0
    beta: float = 0.0

    def apply(self, x: Expr) -> Expr:
        dt = x.dtype
        zero = kb.const(0, dt)

        def c(value: float) -> Expr:
            return kb.const(value, dt)

        if self.name == "tanh":
            return kb.unary("tanh", x)
        if self.name == "sigmoid":
            return kb.unary("sigmoid", x)
        if self.name == "relu":
            return kb.binary("max", x, zero)
        if self.name == "softplus":
            return kb.unary("softplus", x)
        if self.name == "softsign":
            return kb.binary("div", x, kb.binary("add", c(1), kb.unary("abs", x)))
        if self.name == "affine":
            return kb.binary("add", kb.binary("mul", c(self.alpha), x), c(self.beta))
        if self.name == "scaledtanh":
            inner = kb.unary("tanh", kb.binary("mul", c(self.beta), x))
            return kb.binary("mul", c(self.alpha), inner)
        if self.name == "hardsigmoid":
            line = kb.binary("add", kb.binary("mul", c(self.alpha), x), c(self.beta))
            return kb.binary("min", kb.binary("max", line, zero), c(1))
        negative = kb.binary("lt", x, zero, "bool")
        if self.name == "leakyrelu":
            return kb.select(negative, kb.binary("mul", c(self.alpha), x), x)
        if self.name == "elu":
            return kb.select(negative, kb.binary("mul", c(self.alpha), kb.unary("expm1", x)), x)
        if self.name == "thresholdedrelu":
            return kb.select(kb.binary("gt", x, c(self.alpha), "bool"), x, zero)
        raise AssertionError(self.name)


CELLS = {
    # op: (gates, activations per direction, default activations)
    "RNN": (1, 1, ("tanh",)),
    "GRU": (3, 2, ("sigmoid", "tanh")),
    "LSTM": (4, 3, ("sigmoid", "tanh", "tanh")),
}


def parse_activations(node: Node, dirs: int) -> tuple[tuple[Activation, ...], ...]:
    """The activations of each direction, alphas and betas consumed in order by the
    activations that take them (as onnxruntime does). Leniently, one set given to a
    bidirectional node serves both directions, and an RNN's ``[f, f]`` (its schema's
    default) a one-directional one."""
    _, per_dir, default = CELLS[node.op_type]
    names = [str(n).lower() for n in node.attr("activations", ()) or ()] or list(default) * dirs
    alphas = list(node.attr("activation_alpha", ()) or ())
    betas = list(node.attr("activation_beta", ()) or ())
    acts = []
    for name in names:
        if name not in ACTIVATIONS:
            raise LoweringError(
                f"{node.op_type} node {node.name!r}: unknown activation {name!r}; expected "
                f"one of {', '.join(sorted(ACTIVATIONS))}"
            )
        takes_alpha, takes_beta = ACTIVATIONS[name]
        alpha, beta = DEFAULT_PARAMS.get(name, (0.0, 0.0))
        if takes_alpha and alphas:
            alpha = float(alphas.pop(0))
        if takes_beta and betas:
            beta = float(betas.pop(0))
        acts.append(Activation(name, alpha, beta))
    if len(acts) == per_dir and dirs == 2:
        acts *= 2
    elif node.op_type == "RNN" and len(acts) == 2 and dirs == 1:
        acts = acts[:1]
    if len(acts) != per_dir * dirs:
        raise LoweringError(
            f"{node.op_type} node {node.name!r}: {len(acts)} activations given, expected "
            f"{per_dir} per direction × {dirs} direction(s)"
        )
    return tuple(tuple(acts[d * per_dir : (d + 1) * per_dir]) for d in range(dirs))


# ---- statements ----------------------------------------------------------------------


class _Statements:
    """The statements of one kernel, named S0, S1, … in order."""

    def __init__(self) -> None:
        self.list: list[Statement] = []

    @property
    def name(self) -> str:
        return f"S{len(self.list)}"

    def add(self, domain: str, write: Access, expr: Expr, reduce: str | None = None) -> None:
        self.list.append(Statement(self.name, domain, write, expr, reduce))


@dataclass(frozen=True)
class Recurrence:
    """The static facts of one RNN/GRU/LSTM node and the isl text its kernels share."""

    node: Node
    seq: int
    batch: int
    inputs: int
    hidden: int
    dirs: int
    reverse: bool  # the first (only) direction runs backwards in time
    layout: int
    dtype: str
    clip: float | None
    acts: tuple[tuple[Activation, ...], ...]
    lens: str  # sequence_lens ('' when every sequence is full)
    lens_dtype: str
    wide: frozenset[str] = frozenset()
    """Scratch buffers held in the compute type rather than the tensors' type."""

    @property
    def gates(self) -> int:
        return CELLS[self.node.op_type][0]

    @property
    def compute(self) -> str:
        """Arithmetic runs in float32 for float16 tensors, else in their own type."""
        return "float32" if self.dtype == "float16" else self.dtype

    @property
    def state_shape(self) -> list[int]:
        """initial_h, Y_h and the state buffers: [dirs, batch, hidden] (layout 1:
        [batch, dirs, hidden])."""
        if self.layout:
            return [self.batch, self.dirs, self.hidden]
        return [self.dirs, self.batch, self.hidden]

    # -- domains -----------------------------------------------------------------------

    def time(self, k: int) -> str:
        """The time index direction ``d`` reads at step ``k``, as an affine expression."""
        first = self.seq - 1 - k if self.reverse else k
        step = self.seq - 1 - 2 * k
        if self.dirs == 1 or step == 0:
            return str(first)
        return f"{first} + {step}*d" if step > 0 else f"{first} - {-step}*d"

    def domain(
        self, s: str, k: int, dims: dict[str, tuple[int, int]], direction: int | None
    ) -> str:
        """``{ s[t, d, dims…] : t = time(k) and … }``; one direction when given."""
        names = ["t", "d", *dims]
        bounds = [f"t = {self.time(k)}"]
        bounds.append(f"d = {direction}" if direction is not None else f"0 <= d < {self.dirs}")
        bounds += [f"{lo} <= {n} < {hi}" for n, (lo, hi) in dims.items()]
        return f"{{ {s}[{', '.join(names)}] : {' and '.join(bounds)} }}"

    def groups(self, slots: Sequence[int]) -> list[tuple[int | None, tuple[Activation, ...]]]:
        """(direction, or None for all, and the activations at ``slots``): one statement
        per distinct choice of activations."""
        chosen = [tuple(self.acts[d][i] for i in slots) for d in range(self.dirs)]
        if all(c == chosen[0] for c in chosen):
            return [(None, chosen[0])]
        return list(enumerate(chosen))

    # -- accesses and values -------------------------------------------------------------

    def state_index(self, h: str = "h") -> list[str]:
        return ["b", "d", h] if self.layout else ["d", "b", h]

    def y_index(self) -> list[str]:
        return ["b", "t", "d", "h"] if self.layout else ["t", "d", "b", "h"]

    def x_index(self) -> list[str]:
        return ["b", "t", "i"] if self.layout else ["t", "b", "i"]

    def read(self, buffer: str, s: str, dims: Sequence[str], index: Sequence[str]) -> Expr:
        """``buffer[index]`` in the compute type."""
        stored = self.compute if buffer in self.wide else self.dtype
        return kb.cast(kb.load(kb.access(buffer, s, dims, index), stored), self.compute)

    def stored(self, buffer: str, value: Expr) -> Expr:
        """``value`` in the type of ``buffer``."""
        return kb.cast(value, self.compute if buffer in self.wide else self.dtype)

    def const(self, value: float) -> Expr:
        return kb.const(value, self.compute)

    def clipped(self, x: Expr) -> Expr:
        if self.clip is None:
            return x
        low = kb.binary("max", x, self.const(-self.clip))
        return kb.binary("min", low, self.const(self.clip))


def _recurrence(ctx: LowerContext, node: Node) -> Recurrence:
    op = node.op_type
    x, w, r = (ctx.buffer(node.input(i)) for i in range(3))
    gates = CELLS[op][0]
    where = f"{op} node {node.name!r}"
    if not is_float(x.dtype):
        raise LoweringError(f"{where}: X has dtype {x.dtype}; only float types are supported")
    if len(x.shape) != 3 or len(w.shape) != 3 or len(r.shape) != 3:
        raise LoweringError(f"{where}: X, W and R must be 3-D, got {x.shape}, {w.shape}, {r.shape}")
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1):
        raise LoweringError(f"{where}: layout must be 0 or 1, got {layout}")
    seq, batch, inputs = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    direction = str(node.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise LoweringError(f"{where}: unknown direction {direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = r.shape[2]
    if int(node.attr("hidden_size", hidden)) != hidden:
        raise LoweringError(
            f"{where}: hidden_size={node.attr('hidden_size')} but R has shape {r.shape}"
        )
    if op == "LSTM" and int(node.attr("input_forget", 0)) not in (0, 1):
        raise LoweringError(f"{where}: input_forget must be 0 or 1")
    expect = {"W": (dirs, gates * hidden, inputs), "R": (dirs, gates * hidden, hidden)}
    for label, buf in (("W", w), ("R", r)):
        if buf.shape != expect[label]:
            raise LoweringError(f"{where}: {label} has shape {buf.shape}, expected {expect[label]}")
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    optional = {3: ("B", (dirs, 2 * gates * hidden)), 4: ("sequence_lens", (batch,))}
    optional |= {5: ("initial_h", state), 6: ("initial_c", state), 7: ("P", (dirs, 3 * hidden))}
    for index, (label, shape) in optional.items():
        if node.input(index) and ctx.buffer(node.input(index)).shape != shape:
            got = ctx.buffer(node.input(index)).shape
            raise LoweringError(f"{where}: {label} has shape {got}, expected {shape}")
        if index != 4 and node.input(index) and ctx.buffer(node.input(index)).dtype != x.dtype:
            raise LoweringError(f"{where}: {label} does not have X's dtype {x.dtype}")
    lens = node.input(4)
    if lens:
        if ctx.buffer(lens).dtype not in ("int32", "int64"):
            raise LoweringError(f"{where}: sequence_lens must be int32")
        known = ctx.constant(lens)
        if known is not None and (known >= seq).all():
            lens = ""  # every sequence is full: no masks
    clip = node.attr("clip")
    return Recurrence(
        node=node,
        seq=seq,
        batch=batch,
        inputs=inputs,
        hidden=hidden,
        dirs=dirs,
        reverse=direction == "reverse",
        layout=layout,
        dtype=x.dtype,
        clip=None if clip is None else float(clip),
        acts=parse_activations(node, dirs),
        lens=lens,
        lens_dtype=ctx.buffer(lens).dtype if lens else "int32",
    )


# ---- the lowering --------------------------------------------------------------------


@lowers("RNN", "GRU", "LSTM")
def lower_recurrent(ctx: LowerContext, node: Node) -> None:
    rec = _recurrence(ctx, node)
    op = node.op_type
    lbr = op == "GRU" and bool(int(node.attr("linear_before_reset", 0)))
    out = [node.outputs[i] if i < len(node.outputs) else "" for i in range(3)]
    base = node.name or op.lower()

    def state_buffer(output: str, hint: str) -> str:
        if output:
            return ctx.output(output, rec.state_shape, rec.dtype).name
        return ctx.temp(f"{base}.{hint}", rec.state_shape, rec.dtype).name

    h = state_buffer(out[1], "h")
    c = state_buffer(out[2], "c") if op == "LSTM" else ""
    y = ""
    if out[0]:
        y_shape = [rec.seq, rec.dirs, rec.batch, rec.hidden]
        if rec.layout:
            y_shape = [rec.batch, rec.seq, rec.dirs, rec.hidden]
        y = ctx.output(out[0], y_shape, rec.dtype).name
    xw_shape = [rec.seq, rec.dirs, rec.batch, rec.gates * rec.hidden]
    xw = ctx.temp(f"{base}.gates", xw_shape, rec.compute).name
    scratch = ""
    if op == "GRU":
        scratch = ctx.temp(f"{base}.rh", [rec.dirs, rec.batch, rec.hidden], rec.compute).name
    rec = dataclasses.replace(rec, wide=frozenset(name for name in (xw, scratch) if name))

    ctx.kernel(_renamed(node, "init"), _init_state(rec, h, c))
    ctx.kernel(_renamed(node, "proj"), _projection(rec, xw, lbr))
    for k in range(rec.seq):
        st = _Step(rec, k, xw)
        zero_state = k == 0 and not node.input(5)
        if op == "RNN":
            _rnn_step(st, h, zero_state)
        elif op == "GRU":
            _gru_step(st, h, scratch, lbr, zero_state)
        else:
            _lstm_step(st, h, c, zero_state, zero_cell=k == 0 and not node.input(6))
        if y:
            st.assign(y, rec.y_index(), st.keep(st.state(h), rec.const(0)))
        ctx.kernel(_renamed(node, f"step{k}"), st.stmts.list)


def _renamed(node: Node, part: str) -> Node:
    return dataclasses.replace(node, name=f"{node.name or node.op_type.lower()}.{part}")


def _init_state(rec: Recurrence, h: str, c: str) -> list[Statement]:
    """H (and C) = initial_h (initial_c) or 0."""
    stmts = _Statements()
    dims = rec.state_index()
    for buf, source in ((h, rec.node.input(5)), (c, rec.node.input(6))):
        if not buf:
            continue
        s = stmts.name
        value = rec.read(source, s, dims, dims) if source else rec.const(0)
        stmts.add(
            kb.box(s, dims, rec.state_shape), kb.access(buf, s, dims, dims), rec.stored(buf, value)
        )
    return stmts.list


def _projection(rec: Recurrence, xw: str, lbr: bool) -> list[Statement]:
    """XW[t, d, b, g] = Wb[d, g] + Rb[d, g], then += X[t, b, i] * W[d, g, i]."""
    stmts = _Statements()
    width = rec.gates * rec.hidden
    b_name = rec.node.input(3)
    dims = ["t", "d", "b", "g"]
    # a GRU with linear_before_reset adds Rbh inside the reset product, in the steps
    split = 2 * rec.hidden if lbr else width
    for lo, hi, with_rb in ((0, split, True), (split, width, False)):
        if lo == hi:
            continue
        s = stmts.name
        bounds = {"t": (0, rec.seq), "d": (0, rec.dirs), "b": (0, rec.batch), "g": (lo, hi)}
        bias = rec.const(0)
        if b_name:
            bias = rec.read(b_name, s, dims, ["d", "g"])
            if with_rb:
                bias = kb.binary("add", bias, rec.read(b_name, s, dims, ["d", f"g + {width}"]))
        stmts.add(_set(s, bounds), kb.access(xw, s, dims, dims), bias)
    s = stmts.name
    full = [*dims, "i"]
    x = rec.read(rec.node.input(0), s, full, rec.x_index())
    w = rec.read(rec.node.input(1), s, full, ["d", "g", "i"])
    shape = [rec.seq, rec.dirs, rec.batch, width, rec.inputs]
    stmts.add(kb.box(s, full, shape), kb.access(xw, s, full, dims), kb.binary("mul", x, w), "add")
    return stmts.list


def _set(s: str, bounds: dict[str, tuple[int, int]]) -> str:
    cons = " and ".join(f"{lo} <= {n} < {hi}" for n, (lo, hi) in bounds.items())
    return f"{{ {s}[{', '.join(bounds)}] : {cons} }}"


# ---- one time step ---------------------------------------------------------------------


class _Step:
    """The statements of step ``k``: elementwise ones over ``[t, d, b, h]``, recurrent
    contractions over ``[t, d, b, g, r]``, with ``t`` fixed by ``d`` (Recurrence.time)."""

    def __init__(self, rec: Recurrence, k: int, xw: str):
        self.rec, self.k, self.xw = rec, k, xw
        self.stmts = _Statements()
        self.dims = ["t", "d", "b", "h"]

    def read(self, buffer: str, index: Sequence[str]) -> Expr:
        return self.rec.read(buffer, self.stmts.name, self.dims, index)

    def gate_index(self, j: int) -> list[str]:
        return ["t", "d", "b", f"h + {j * self.rec.hidden}"]

    def gate(self, j: int) -> Expr:
        """Pre-activation (or, once activated in place, the value) of gate ``j``."""
        return self.read(self.xw, self.gate_index(j))

    def state(self, buffer: str) -> Expr:
        return self.read(buffer, self.rec.state_index())

    def keep(self, new: Expr, old: Expr) -> Expr:
        """``t < sequence_lens[b] ? new : old`` (just ``new`` when every sequence is full)."""
        if not self.rec.lens:
            return new
        at = kb.access(self.rec.lens, self.stmts.name, self.dims, ["b"])
        length = kb.cast(kb.load(at, self.rec.lens_dtype), "int64")
        return kb.select(kb.binary("lt", Iter("int64", "t"), length, "bool"), new, old)

    def assign(
        self, buffer: str, index: Sequence[str], value: Expr, direction: int | None = None
    ) -> None:
        """``buffer[index] = value`` over [t, d, b, h] (one direction when given)."""
        s, rec = self.stmts.name, self.rec
        domain = rec.domain(s, self.k, {"b": (0, rec.batch), "h": (0, rec.hidden)}, direction)
        self.stmts.add(domain, kb.access(buffer, s, self.dims, index), rec.stored(buffer, value))

    def activate(self, j: int, slot: int) -> None:
        """Gate ``j`` in place: act[slot](clip(gate))."""
        for direction, (act,) in self.rec.groups([slot]):
            self.assign(
                self.xw, self.gate_index(j), act.apply(self.rec.clipped(self.gate(j))), direction
            )

    def recur(self, state: str, weight: str, gates: tuple[int, int], target: str = "") -> None:
        """``XW[t, d, b, g] += state[d, b, r] * weight[d, g, r]`` for g in ``gates``, or
        with ``target`` (a [d, b, h] scratch buffer) ``target[d, b, g - lo] += …``. A
        scratch ``state`` is indexed [d, b, r], a state buffer as Y_h is."""
        rec, s = self.rec, self.stmts.name
        lo, hi = gates
        dims = ["t", "d", "b", "g", "r"]
        domain = rec.domain(
            s, self.k, {"b": (0, rec.batch), "g": (lo, hi), "r": (0, rec.hidden)}, None
        )
        src_index = ["d", "b", "r"] if state in rec.wide else rec.state_index("r")
        write_index = ["d", "b", f"g - {lo}"] if target else ["t", "d", "b", "g"]
        product = kb.binary(
            "mul", rec.read(state, s, dims, src_index), rec.read(weight, s, dims, ["d", "g", "r"])
        )
        self.stmts.add(domain, kb.access(target or self.xw, s, dims, write_index), product, "add")


def _rnn_step(st: _Step, h: str, zero_state: bool) -> None:
    """``H = f(clip(XW + H·Rᵀ))``."""
    rec = st.rec
    if not zero_state:
        st.recur(h, rec.node.input(2), (0, rec.hidden))
    for direction, (f,) in rec.groups([0]):
        new = f.apply(rec.clipped(st.gate(0)))
        st.assign(h, rec.state_index(), st.keep(new, st.state(h)), direction)


def _gru_step(st: _Step, h: str, scratch: str, lbr: bool, zero_state: bool) -> None:
    """Gates z, r, h at offsets 0, H, 2H of XW; f = act 0, g = act 1. The candidate
    h~ is activated in place, then ``H = h~ + z ⊙ (H - h~)`` (= (1-z) ⊙ h~ + z ⊙ H)."""
    rec = st.rec
    r_weight, hid = rec.node.input(2), rec.hidden
    rh = ["d", "b", "h"]
    if not zero_state:
        st.recur(h, r_weight, (0, 2 * hid))
    if lbr:
        # scratch = H·Rhᵀ + Rbh;  h~ = g(clip(XW_h + f(clip(XW_r)) ⊙ scratch))
        bias = st.read(rec.node.input(3), ["d", f"h + {5 * hid}"]) if rec.node.input(3) else None
        st.assign(scratch, rh, bias if bias is not None else rec.const(0))
        if not zero_state:
            st.recur(h, r_weight, (2 * hid, 3 * hid), target=scratch)
        for direction, (f, g) in rec.groups([0, 1]):
            reset = f.apply(rec.clipped(st.gate(1)))
            pre = kb.binary("add", st.gate(2), kb.binary("mul", reset, st.read(scratch, rh)))
            st.assign(st.xw, st.gate_index(2), g.apply(rec.clipped(pre)), direction)
    else:
        # scratch = f(clip(XW_r)) ⊙ H;  h~ = g(clip(XW_h + scratch·Rhᵀ))
        if not zero_state:
            for direction, (f,) in rec.groups([0]):
                reset = f.apply(rec.clipped(st.gate(1)))
                st.assign(scratch, rh, kb.binary("mul", reset, st.state(h)), direction)
            st.recur(scratch, r_weight, (2 * hid, 3 * hid))
        st.activate(2, 1)
    for direction, (f,) in rec.groups([0]):
        update, cand = f.apply(rec.clipped(st.gate(0))), st.gate(2)
        new = kb.binary("add", cand, kb.binary("mul", update, kb.binary("sub", st.state(h), cand)))
        st.assign(h, rec.state_index(), st.keep(new, st.state(h)), direction)


def _lstm_step(st: _Step, h: str, c: str, zero_state: bool, zero_cell: bool) -> None:
    """Gates i, o, f, c at offsets 0, H, 2H, 3H of XW; f, g, h = acts 0, 1, 2; peepholes
    P = [Pi, Po, Pf]. Two fused statements::

        C = f(XW_f + Pf ⊙ C) ⊙ C + f(XW_i + Pi ⊙ C) ⊙ g(XW_c)   (input_forget: C + i ⊙ (g - C))
        H = f(XW_o + Po ⊙ C) ⊙ h(C)
    """
    rec = st.rec
    node, hid = rec.node, rec.hidden
    if not zero_state:
        st.recur(h, node.input(2), (0, 4 * hid))
    p = node.input(7)
    # XW gate -> its peephole's offset in P (the cell gate has none); the i and f
    # peepholes see the previous cell state, which is 0 before the first step
    peepholes = {1: hid} if zero_cell else {0: 0, 1: hid, 2: 2 * hid}

    def gate(j: int, act: Activation) -> Expr:
        pre = st.gate(j)
        if p and j in peepholes:
            peep = st.read(p, ["d", f"h + {peepholes[j]}"])
            pre = kb.binary("add", pre, kb.binary("mul", peep, st.state(c)))
        return act.apply(rec.clipped(pre))

    coupled = bool(int(node.attr("input_forget", 0)))
    for direction, (f, g) in rec.groups([0, 1]):
        i, cand = gate(0, f), gate(3, g)
        if zero_cell:
            new = kb.binary("mul", i, cand)
        elif coupled:
            new = kb.binary(
                "add", st.state(c), kb.binary("mul", i, kb.binary("sub", cand, st.state(c)))
            )
        else:
            new = kb.binary(
                "add", kb.binary("mul", gate(2, f), st.state(c)), kb.binary("mul", i, cand)
            )
        st.assign(c, rec.state_index(), st.keep(new, st.state(c)), direction)
    for direction, (f, act_h) in rec.groups([0, 2]):
        new = kb.binary("mul", gate(1, f), act_h.apply(st.state(c)))
        st.assign(h, rec.state_index(), st.keep(new, st.state(h)), direction)
