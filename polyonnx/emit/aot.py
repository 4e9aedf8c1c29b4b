"""A compiled model as a shared library with a C API: ``libNAME.so`` and ``NAME.h``.

The model's modules (emit/objects.py) and the worker pool are compiled to objects of
position-independent code, every symbol of them hidden. A C file made for the model
(the header, tables of its inputs, outputs and constants, and ``capi/runtime.c`` with
NAME for PNAME) holds the API;
the constants are one blob of cache-line-aligned tensors, embedded in the library's
read-only data (``.incbin``), or for WEIGHTS_FILE_BYTES and more written beside it as
NAME.weights and mapped at open time. docs/deploy.md documents the API.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from polyonnx.emit.abi import ONNX_TYPES, EntryAbi, Port
from polyonnx.emit.module import ModulePlan
from polyonnx.emit.objects import compile_ir, compile_objects
from polyonnx.emit.pool import pool_module
from polyonnx.emit.toolchain import find_toolchain
from polyonnx.errors import CodegenError
from polyonnx.frontend.batch import Batched, BatchPlan
from polyonnx.target import Target

WEIGHTS_FILE_BYTES = 2**31
"""Constants of this many bytes or more go to NAME.weights: a relocation in a library's
code reaches only ±2 GB (POLYONNX_WEIGHTS_FILE_BYTES overrides it, for tests)."""
ALIGN = 64
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


@dataclass(frozen=True)
class Library:
    """What ``write_library`` wrote."""

    library: Path
    header: Path
    weights: Path | None
    """NAME.weights, when the constants are too big to embed."""


def write_library(
    native: NativeModel,
    target: Target,
    directory: str | os.PathLike,
    name: str,
    default_threads: int = 0,
    *,
    batch: BatchPlan | None = None,
    sizes: Sizes | None = None,
) -> Library:
    """Compile ``native`` for ``target`` and write DIR/libNAME.so and DIR/NAME.h;
    ``NAME_open(0)`` takes ``default_threads`` threads (0: one per online core). ``batch``:
    ``native`` is one sample of a model run in blocks along it (frontend/batch.py); NAME_run
    then takes any batch size and runs the entry once per sample. ``sizes``: ``native``
    is parametric, one entry for every value of its symbols (capi/parametric.c)."""
    if not NAME.match(name):
        raise CodegenError(f"the library name {name!r} must be a C identifier (letters, digits, _)")
    abi = native.abi
    _check_ports(abi)
    out = Path(directory).resolve()
    out.mkdir(parents=True, exist_ok=True)
    toolchain = find_toolchain(target.triple)
    header_text = header(abi, name, batch, sizes)
    objects = object_files(native, target)
    with tempfile.TemporaryDirectory(prefix="polyonnx-aot-") as work:
        blob, offsets = _weights_blob(abi, native.constants)
        limit = int(os.environ.get("POLYONNX_WEIGHTS_FILE_BYTES", WEIGHTS_FILE_BYTES))
        to_file = len(blob) >= limit
        weights_path = Path(out if to_file else work) / f"{name}.weights"
        weights_path.write_bytes(blob)
        names = [f"{name}{i}.o" for i, _ in enumerate(objects)]
        for file, data in zip(names, objects, strict=True):
            (Path(work) / file).write_bytes(data)
        threads = max(int(default_threads), 0)
        settings = Settings(offsets, weights_path, to_file, threads, batch, sizes)
        (Path(work) / f"{name}.c").write_text(c_source(abi, name, header_text, settings))
        library = out / f"lib{name}.so"
        flags = ["-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wl,-z,nodelete"]
        libraries = ["-lm", "-lpthread", *(["-ldl"] if to_file else [])]
        arguments = [*flags, "-o", str(library), f"{name}.c", *names, *libraries]
        toolchain.run(arguments, cwd=work)
    header_path = out / f"{name}.h"
    header_path.write_text(header_text)
    return Library(library, header_path, weights_path if to_file else None)


@dataclass(frozen=True)
class NativeModel:
    """What a library is built from: the model's modules, its entry's ABI and constants."""

    plan: ModulePlan
    buffers: Mapping[str, object]
    abi: EntryAbi
    constants: Mapping[str, np.ndarray]


def object_files(native: NativeModel, target: Target) -> list[bytes]:
    """The model's modules and the worker pool, compiled for ``target`` as
    position-independent code, every symbol hidden (the C API is the only export)."""
    plan = native.plan
    compiled = compile_objects(plan.entry, plan.jobs, native.buffers, target, pic=True)
    pool = compile_ir(str(pool_module(target.triple, placement=True)), target, pic=True)
    return [*compiled.objects, pool]


def _check_ports(abi: EntryAbi) -> None:
    bad = [p for p in (*abi.inputs, *abi.outputs) if p.dtype not in ONNX_TYPES]
    if bad:
        listed = ", ".join(f"{p.name!r} ({p.dtype})" for p in bad)
        raise CodegenError(f"a C API passes tensors of fixed-size elements only; not {listed}")


def _weights_blob(abi: EntryAbi, constants: Mapping[str, np.ndarray]) -> tuple[bytes, list[int]]:
    """Every constant of ``abi.constant_slots`` at an ALIGN-byte offset of one blob (once,
    for a constant in two slots), and each slot's offset."""
    parts, placed, at = [], {}, 0
    for _, name in abi.constant_slots:
        if name in placed:
            continue
        data = np.ascontiguousarray(constants[name]).tobytes()
        placed[name] = at
        pad = -len(data) % ALIGN
        parts += [data, b"\0" * pad]
        at += len(data) + pad
    return b"".join(parts), [placed[name] for _, name in abi.constant_slots]


def header(
    abi: EntryAbi, name: str, batch: BatchPlan | None = None, sizes: Sizes | None = None
) -> str:
    """NAME.h: the API's declarations and, in a comment, the model's inputs and outputs
    (-1 for a symbolic dim)."""
    ins, outs = batches(abi, batch)
    lines = [f"/* {name}: a model compiled by polyonnx. Inputs and outputs, in ONNX order:"]
    for kind, ports, batched in (("input ", abi.inputs, ins), ("output", abi.outputs, outs)):
        for i, (port, b) in enumerate(zip(ports, batched, strict=True)):
            lines.append(f" *   {kind} {i}: {_described(port, b)}")
    if batch is not None:
        lines += [
            f" * -1 is the batch {_comment(repr(batch.symbol))}, of any size: give input_dims to",
            f" * {name}_run; {name}_output_dims_for gives the outputs' dims for a batch.",
        ]
    if sizes is not None:
        lines += [
            " * -1 is a symbolic dim, of any size from 1: give input_dims to",
            f" * {name}_run; {name}_output_dims_at gives the outputs' dims for the symbols'",
            " * values. Every port's dims in the symbols:",
            *(f" *   {line}" for line in _comment(sizes.text).split("\n")),
        ]
    lines += [" * See docs/deploy.md. */", ""]
    text = resources.files("polyonnx.emit").joinpath("capi/header.h").read_text()
    return "\n".join(lines) + text.replace("PNAME", name).replace("PGUARD", name.upper())


def _comment(text: str) -> str:
    """``text`` for a C comment (which ``*/`` would end)."""
    return text.replace("*/", "* /")


def _described(port: Port, batch: Batched | None = None) -> str:
    dims = list(reported_dims(port, batch))
    return f"{port.name} {port.dtype} {dims} (onnx type {ONNX_TYPES[port.dtype]})"


def batches(
    abi: EntryAbi, batch: BatchPlan | None
) -> tuple[list[Batched | None], list[Batched | None]]:
    """Each input's and output's batch (None: not batched, or no batch at all)."""
    if batch is None:
        return [None] * len(abi.inputs), [None] * len(abi.outputs)
    return (
        [batch.inputs.get(p.name) for p in abi.inputs],
        [batch.outputs.get(p.name) for p in abi.outputs],
    )


def reported_dims(port: Port, batch: Batched | None) -> tuple[int, ...]:
    """The dims NAME_input_dims and NAME_output_dims report: -1 on the batch's axis."""
    if batch is None:
        return tuple(port.shape)
    return tuple(-1 if axis == batch.axis else d for axis, d in enumerate(port.shape))


def _layout(port: Port, batch: Batched | None) -> tuple[int, int, int]:
    """How one sample lies in ``port``'s data for N samples: (its batch axis, -1 if
    none; runs of the sample's bytes; bytes a run). Run c of sample n starts at
    ``(c * N + n) * run_bytes``."""
    bytes_ = port.size * np.dtype(port.dtype).itemsize
    if batch is None:
        return -1, 1, bytes_
    runs = int(np.prod(port.shape[: batch.axis], dtype=np.int64)) * batch.outer
    return batch.axis, runs, bytes_ // max(runs, 1)


@dataclass(frozen=True)
class Settings:
    """How the C API of one library is built."""

    offsets: list[int]
    """Each constant's offset in the weights blob."""
    weights: Path
    to_file: bool
    """The weights are mapped from ``weights`` at open time, not embedded."""
    default_threads: int
    batch: BatchPlan | None = None
    """The model's batch: the library runs its entry once per sample."""
    sizes: Sizes | None = None
    """The model is parametric: its tensors' sizes as polynomials in its symbols."""


def c_source(abi: EntryAbi, name: str, header_text: str, settings: Settings) -> str:
    """The C file of the model's API: header, tables, then capi/runtime.c and the file of
    the library's kind (capi/batch.c, or capi/parametric.c), for ``name``."""
    capi = resources.files("polyonnx.emit").joinpath("capi")
    sizes = settings.sizes
    kind = "parametric.c" if sizes else "batch.c"
    runtime = capi.joinpath("runtime.c").read_text() + capi.joinpath(kind).read_text()
    weights = settings.weights
    defines = {
        "PNAME_INPUTS": len(abi.inputs),
        "PNAME_OUTPUTS": len(abi.outputs),
        "PNAME_CONSTANTS": len(abi.constant_slots),
        "PNAME_SLOTS": abi.slot_count,
        "PNAME_ARENA_SLOT": abi.arena_slot,
        "PNAME_ERROR_SLOT": abi.error_slot,
        "PNAME_CHECKS": len(abi.checks),
        "PNAME_ARENA_BYTES": f"{abi.arena_bytes}ULL",
        "PNAME_DEFAULT_THREADS": settings.default_threads,
        "PNAME_WEIGHTS_FILE": int(settings.to_file),
        "PNAME_WEIGHTS_BYTES": f"{weights.stat().st_size}ULL",
        "PNAME_WEIGHTS_NAME": _c_string(weights.name),
        "PNAME_WEIGHTS_PATH": _c_string(str(weights)),
        "PNAME_BATCH_NAME": "NULL" if settings.batch is None else _c_string(settings.batch.symbol),
        "PNAME_RUN_EMPTY": int(_run_empty(abi, settings.batch)),
        "PNAME_MAX_RANK": max((len(p.shape) for p in (*abi.inputs, *abi.outputs)), default=0) + 1,
        "PNAME_SYMBOLS": len(sizes.symbols) if sizes else 0,
        "PNAME_ROOTS": len(sizes.roots) if sizes else 0,
        "PNAME_PARAMS": len(sizes.parameters) if sizes else 0,
        "PNAME_ROOTS_SLOT": sizes.roots_slot if sizes else -1,
        "PNAME_PARAMS_SLOT": sizes.params_slot if sizes else -1,
    }
    lines = [f"#define {key} {value}" for key, value in defines.items()]
    tables = _size_tables(abi, sizes) if sizes else _batch_tables(abi, settings.batch)
    body = "\n".join(
        ["#define _GNU_SOURCE 1", header_text, *lines, *_tables(abi, settings.offsets), *tables]
    )
    return (body + "\n" + runtime).replace("PNAME", name)


Terms = tuple[tuple[int, int, int], ...]
"""A polynomial in a library's symbols: terms (coefficient, symbol index or -1, symbol
index or -1), the symbols multiplied."""


@dataclass(frozen=True)
class Root:
    """An arena tensor of a parametric library: its dims, element bytes and the kernels
    (by step) that first and last touch it."""

    dims: tuple[Terms, ...]
    itemsize: int
    first: int
    last: int


@dataclass(frozen=True)
class Sizes:
    """How a parametric library sizes its tensors from its symbols' values."""

    symbols: tuple[str, ...]
    parameters: tuple[tuple[int, int], ...]
    """The values in the entry's parameters slot: products of two symbols (-1: one)."""
    input_symbols: tuple[tuple[int, ...], ...]
    """Per input dim: the symbol it is, or -1 for a fixed dim."""
    inputs: tuple[tuple[Terms, ...], ...]
    outputs: tuple[tuple[Terms, ...], ...]
    roots: tuple[Root, ...]
    roots_slot: int
    """The entry's slot of the first arena tensor; the others follow."""
    params_slot: int
    text: str
    """The ports' dims by symbol, for the header."""


def _size_tables(abi: EntryAbi, sizes: Sizes) -> list[str]:
    """The tables of capi/parametric.c: every dim as a polynomial (poly_starts into the
    term_* tables), per port and arena tensor."""
    polys: dict[Terms, int] = {}
    lines = []

    def poly_table(name: str, dims: tuple[Terms, ...]) -> str:
        numbers = [polys.setdefault(d, len(polys)) for d in dims]
        lines.append(_array("const int", name, numbers))
        return name

    shown = []
    for kind, ports, per in (
        ("input", abi.inputs, sizes.inputs),
        ("output", abi.outputs, sizes.outputs),
    ):
        names = [poly_table(f"{kind}_polys_{i}", dims) for i, dims in enumerate(per)]
        lines.append(_array("const int *const", f"{kind}_polys", names))
        shown.append(_array("const int64_t *const", f"{kind}_shown_dims",
                            [f"{kind}_dims_{i}" for i in range(len(ports))]))  # fmt: skip
    symbols = [f"input_symbols_{i}" for i in range(len(abi.inputs))]
    for name, row in zip(symbols, sizes.input_symbols, strict=True):
        lines.append(_array("const int", name, list(row)))
    roots = [poly_table(f"root_polys_{r}", root.dims) for r, root in enumerate(sizes.roots)]
    terms = [t for poly in polys for t in poly]
    starts = [0]
    for poly in polys:
        starts.append(starts[-1] + len(poly))
    return [
        *lines,
        *shown,
        _array("const int *const", "input_symbols", symbols),
        _array("const char *const", "symbol_names", [_c_string(n) for n in sizes.symbols]),
        _array("const int *const", "root_polys", roots),
        _array("const int", "root_ranks", [len(r.dims) for r in sizes.roots]),
        _array("const int", "root_itemsizes", [r.itemsize for r in sizes.roots]),
        _array("const int", "root_first", [r.first for r in sizes.roots]),
        _array("const int", "root_last", [r.last for r in sizes.roots]),
        _array("const int", "poly_starts", starts),
        _array("const int64_t", "term_coeffs", [f"{c}LL" for c, _, _ in terms]),
        _array("const int", "term_a", [a for _, a, _ in terms]),
        _array("const int", "term_b", [b for _, _, b in terms]),
        _array("const int", "param_a", [a for a, _ in sizes.parameters]),
        _array("const int", "param_b", [b for _, b in sizes.parameters]),
    ]


def _tables(abi: EntryAbi, offsets: list[int]) -> list[str]:
    lines = []
    for kind, ports in (("input", abi.inputs), ("output", abi.outputs)):
        indices = range(len(ports))
        for i, port in enumerate(ports):
            dims = ", ".join(f"{d}LL" for d in port.shape) or "0"
            lines.append(f"static const int64_t {kind}_dims_{i}[] = {{{dims}}};")
        lines += [
            _array("const char *const", f"{kind}_names", [_c_string(p.name) for p in ports]),
            _array("const int", f"{kind}_types", [ONNX_TYPES[p.dtype] for p in ports]),
            _array("const int", f"{kind}_ranks", [len(p.shape) for p in ports]),
            _array("const int", f"{kind}_itemsizes", [np.dtype(p.dtype).itemsize for p in ports]),
            _array("const int64_t *const", f"{kind}_dims", [f"{kind}_dims_{i}" for i in indices]),
        ]  # fmt: skip
    lines.append(_array("const int", "input_slots", [_slot(p) for p in abi.inputs]))
    copies = _output_copies(abi)
    lines += [
        _array("const int", "output_slots", [slot for slot, _, _ in copies]),
        _array("const int", "output_copy_kind", [kind for _, kind, _ in copies]),
        _array("const int", "output_copy_index", [index for _, _, index in copies]),
        _array("const int", "constant_slots", [slot for slot, _ in abi.constant_slots]),
        _array("const uint64_t", "constant_offsets", [f"{o}ULL" for o in offsets]),
        *_check_tables(abi),
    ]
    return lines


def _batch_tables(abi: EntryAbi, batch: BatchPlan | None) -> list[str]:
    """Per input and output: the dims reported (-1 on the batch), and how one sample lies
    in its data (``_layout``; ``scratch``: copied through a buffer of the session)."""
    lines = []
    empty = _run_empty(abi, batch)
    for kind, ports, batched in zip(("input", "output"), (abi.inputs, abi.outputs),
                                    batches(abi, batch), strict=True):  # fmt: skip
        layouts = [_layout(p, b) for p, b in zip(ports, batched, strict=True)]
        for i, (port, b) in enumerate(zip(ports, batched, strict=True)):
            dims = ", ".join(f"{d}LL" for d in reported_dims(port, b)) or "0"
            lines.append(f"static const int64_t {kind}_shown_dims_{i}[] = {{{dims}}};")
        shown = [f"{kind}_shown_dims_{i}" for i in range(len(ports))]
        factors = [f"{1 if b is None else b.factor}LL" for b in batched]
        scratch = [int(axis >= 0 and (runs > 1 or empty)) for axis, runs, _ in layouts]
        lines += [
            _array("const int64_t *const", f"{kind}_shown_dims", shown),
            _array("const int", f"{kind}_batch_axis", [axis for axis, _, _ in layouts]),
            _array("const int64_t", f"{kind}_runs", [f"{runs}LL" for _, runs, _ in layouts]),
            _array("const uint64_t", f"{kind}_run_bytes", [f"{n}ULL" for _, _, n in layouts]),
            _array("const int", f"{kind}_scratch", scratch),
        ]
        if kind == "input":  # a sample's rows on the batch's axis
            lines.append(_array("const int64_t", "input_batch_factor", factors))
    return lines


def _run_empty(abi: EntryAbi, batch: BatchPlan | None) -> bool:
    """Whether a run of no samples still runs the entry once, on zeros: an output not
    batched is the same for every sample, and none gives it."""
    return batch is not None and any(b is None for b in batches(abi, batch)[1])


def _check_tables(abi: EntryAbi) -> list[str]:
    """Per run-time check: its site number, its message split where the value goes, and
    whether it shows the value."""
    parts = [(*c.message.split("{value}", 1), "")[:2] for c in abi.checks]
    return [
        _array("const int64_t", "check_sites", [f"{c.site}LL" for c in abi.checks]),
        _array("const int", "check_shows", [int("{value}" in c.message) for c in abi.checks]),
        _array("const char *const", "check_before", [_c_string(p[0]) for p in parts]),
        _array("const char *const", "check_after", [_c_string(p[1]) for p in parts]),
    ]


def _output_copies(abi: EntryAbi) -> list[tuple[int, int, int]]:
    """Per output: its slot (-1 if the entry does not write it), and what it is a copy
    of: 0 nothing, 1 input, 2 constant, 3 an earlier output (a name given twice)."""
    inputs = [p.name for p in abi.inputs]
    constants = [name for _, name in abi.constant_slots]
    first: dict[str, int] = {}
    rows = []
    for i, port in enumerate(abi.outputs):
        if port.name in first:
            rows.append((-1, 3, first[port.name]))
        elif port.copy_of in inputs:
            rows.append((-1, 1, inputs.index(port.copy_of)))
        elif port.copy_of is not None:
            rows.append((-1, 2, constants.index(port.copy_of)))
        else:
            rows.append((_slot(port), 0, 0))
        first.setdefault(port.name, i)
    return rows


def _slot(port: Port) -> int:
    return -1 if port.slot is None else port.slot


def _array(ctype: str, name: str, values: list) -> str:
    items = ", ".join(str(v) for v in values) or "0"
    return f"static {ctype} {name}[] = {{{items}}};"


def _c_string(text: str) -> str:
    escaped = "".join(
        chr(c) if 32 <= c < 127 and chr(c) not in '"\\?' else f"\\{c:03o}" for c in text.encode()
    )
    return f'"{escaped}"'
