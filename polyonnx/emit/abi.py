"""What the native entry ``polyonnx_main(ptr slots)`` of a compiled model expects, as data.

The entry takes one array of pointers (slots): the model's inputs, computed outputs and
constants, then the arena for intermediates, then the error record (``int64 [site,
value]``, zero before a run; a failed run-time check writes it, see :class:`CheckInfo`).
An :class:`EntryAbi` names every slot and the model's ports (inputs and outputs in ONNX
order, with dtype and shape), so that code which never saw the Program — a shared
library's C API, a session loaded from the compile cache — can fill the slots and check
what a caller passes. It is plain data, saved as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

ONNX_TYPES = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "complex64": 14,
    "complex128": 15, "bfloat16": 16, "float8_e4m3fn": 17, "float8_e4m3fnuz": 18,
    "float8_e5m2": 19, "float8_e5m2fnuz": 20, "uint4": 21, "int4": 22, "float4_e2m1fn": 23,
}  # fmt: skip
"""numpy dtype name -> onnx TensorProto.DataType, for the dtypes a slot can hold (not
strings: they have no fixed-size bytes)."""


@dataclass(frozen=True)
class Port:
    """A model input or output: a dense row-major tensor of ``dtype`` and ``shape``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    slot: int | None
    """The entry's slot for it; None for an input no kernel reads, and for an output the
    entry does not compute (``copy_of``)."""
    copy_of: str | None = None
    """An output that *is* an input or a constant of the model: copied from that."""

    @property
    def size(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class KernelInfo:
    """A kernel as a profile shows it."""

    name: str
    op_type: str
    multiply_adds: int


@dataclass(frozen=True)
class CheckInfo:
    """A run-time check of the model's code: the site number native code records when it
    fails, and the error message, with ``{value}`` for the value it recorded."""

    site: int
    message: str

    def text(self, value: int) -> str:
        return self.message.replace("{value}", str(value))


def failure(checks: Sequence[CheckInfo], site: int, value: int) -> str:
    """The message of the check ``site`` among ``checks`` that failed on ``value``."""
    for check in checks:
        if check.site == site:
            return check.text(value)
    return f"run-time check {site} failed on the value {value}"


@dataclass(frozen=True)
class EntryAbi:
    """The slots of a compiled model's entry and its ports."""

    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    constant_slots: tuple[tuple[int, str], ...]
    """(slot, constant name) for every constant the kernels read."""
    arena_slot: int
    arena_bytes: int
    kernels: tuple[KernelInfo, ...]
    """Per call site of the entry, in call order."""
    input_offsets: tuple[tuple[str, int], ...] = ()
    """Inputs whose code is laid out for a start this many bytes past a cache line."""
    checks: tuple[CheckInfo, ...] = ()
    """Every run-time check of the code, by site number."""

    @property
    def error_slot(self) -> int:
        return self.arena_slot + 1

    @property
    def slot_count(self) -> int:
        return self.arena_slot + 2

    def failure(self, site: int, value: int) -> str:
        """The message of the check ``site`` that failed on ``value``."""
        return failure(self.checks, site, value)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EntryAbi:
        data = json.loads(text)
        return cls(
            inputs=tuple(_port(p) for p in data["inputs"]),
            outputs=tuple(_port(p) for p in data["outputs"]),
            constant_slots=tuple((int(s), str(n)) for s, n in data["constant_slots"]),
            arena_slot=int(data["arena_slot"]),
            arena_bytes=int(data["arena_bytes"]),
            kernels=tuple(KernelInfo(**k) for k in data["kernels"]),
            input_offsets=tuple((str(n), int(o)) for n, o in data["input_offsets"]),
            checks=tuple(CheckInfo(int(c["site"]), str(c["message"])) for c in data["checks"]),
        )


def _port(data: dict) -> Port:
    return Port(
        name=data["name"],
        dtype=data["dtype"],
        shape=tuple(int(d) for d in data["shape"]),
        slot=data["slot"],
        copy_of=data["copy_of"],
    )
