"""One exception hierarchy for everything polyonnx raises on purpose."""

from __future__ import annotations


class PolyonnxError(Exception):
    """Base class of every error polyonnx raises deliberately."""


class ModelError(PolyonnxError):
    """The model file is malformed, fails the ONNX checker, or cannot be loaded."""


class UnsupportedOpError(ModelError):
    """The model uses operators polyonnx cannot lower.

    ``ops`` maps every unsupported op type to the names of the nodes that use it, so one
    error lists everything that stands in the way, not just the first offender.
    """

    def __init__(self, ops: dict[str, list[str]], reasons: dict[str, str] | None = None):
        self.ops = {op: list(nodes) for op, nodes in sorted(ops.items())}
        self.reasons = dict(reasons or {})
        lines = [f"the model uses {len(self.ops)} unsupported operator type(s):"]
        for op, nodes in self.ops.items():
            shown = ", ".join(repr(n) for n in nodes[:8])
            more = f" and {len(nodes) - 8} more" if len(nodes) > 8 else ""
            why = f" ({self.reasons[op]})" if op in self.reasons else ""
            lines.append(f"  {op}{why}: node(s) {shown}{more}")
        super().__init__("\n".join(lines))


class LoweringError(PolyonnxError):
    """A supported op got attributes or inputs that its lowering cannot handle."""


class ValueRequiredError(LoweringError):
    """Lowering needs the *value* of graph inputs (a Reshape's shape, a Reduce's axes).

    Sessions answer by compiling once per distinct value of those inputs.
    """

    def __init__(self, inputs: list[str], message: str):
        self.inputs = list(inputs)
        super().__init__(message)


class InputError(PolyonnxError, ValueError):
    """An input given to a session has the wrong name, dtype, rank or shape."""


class ArgumentError(PolyonnxError, TypeError, ValueError):
    """An argument of a public entry point (other than the model and run-time inputs) has
    the wrong type or value. It is a TypeError and a ValueError too, so code that catches
    what Python's own checks raise still catches it."""


class RunError(PolyonnxError, RuntimeError):
    """Native code met a bad value at run time: an index out of range, an integer division
    by zero. The message names the node, its op and the value; no output is returned."""


class ScheduleError(PolyonnxError):
    """A schedule transformation is illegal or malformed."""


class CodegenError(PolyonnxError):
    """Code generation or JIT compilation failed."""


class TuningError(PolyonnxError):
    """The tuner could not run or its database is unusable."""


class TargetError(PolyonnxError):
    """The target triple or CPU is unknown to LLVM or not one polyonnx generates code for."""


def describe(value: object) -> str:
    """``value`` as an error message shows what was given: its type and a short repr."""
    if value is None:
        return "None"
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the error being reported
        text = object.__repr__(value)
    text = " ".join(text.split())  # an array's repr spans lines
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
