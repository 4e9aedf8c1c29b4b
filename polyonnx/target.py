"""What CPU we generate code for: name, triple, features, vector width, registers, caches;
the host's (:func:`host_target`) or another one named by a triple and a CPU
(:func:`make_target`)."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import cache

from polyonnx.errors import TargetError


def _llvm():
    """llvmlite's binding, imported when a target is first asked of LLVM: describing a
    target (lanes, registers) needs no LLVM, and scheduling imports this module."""
    import llvmlite.binding as llvm

    return llvm


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    features: str
    vector_bits: int
    cores: int
    l1d_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 32 * 1024 * 1024

    def lanes(self, itemsize: int = 4) -> int:
        """SIMD lanes of elements of ``itemsize`` bytes in one vector register."""
        return max(self.vector_bits // (8 * itemsize), 1)

    @property
    def arch(self) -> str:
        """The triple's architecture: "x86_64", "aarch64"."""
        return self.triple.split("-", 1)[0]

    @property
    def vector_registers(self) -> int:
        """Architectural SIMD registers: 32 with AVX-512 and on aarch64 (NEON), 16 with
        AVX2, AVX and SSE. Read from the features, so a copy with AVX-512 turned off
        (``dataclasses.replace``) has 16."""
        if self.arch == "aarch64" or "+avx512f" in self.features.split(","):
            return 32
        return 16

    @property
    def key(self) -> str:
        """Identifies code compatibility: same key, same generated code (the architecture
        too: "generic" names an x86-64 CPU and an aarch64 one)."""
        return f"{self.arch}:{self.name}:{self.vector_bits}"


def initialize_llvm() -> None:
    _llvm().initialize_native_target()
    _llvm().initialize_native_asmprinter()


def llvm_version() -> str:
    """The version of the LLVM that llvmlite links, e.g. "22.1.0"."""
    return ".".join(str(part) for part in _llvm().llvm_version_info)


@cache
def host_target() -> Target:
    """The machine we run on, as llvmlite sees it."""
    initialize_llvm()
    features = _llvm().get_host_cpu_features().flatten()
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    return Target(
        name=_llvm().get_host_cpu_name(),
        triple=_llvm().get_process_triple(),
        features=features,
        vector_bits=_vector_bits(enabled),
        cores=os.cpu_count() or 1,
        **_cache_sizes(),
    )


def _vector_bits(enabled: set[str]) -> int:
    """The widest float vector register of the enabled features (SSE and NEON: 128)."""
    if "avx512f" in enabled:
        return 512
    if "avx2" in enabled or "avx" in enabled:
        return 256
    return 128


ARCHES = {"x86_64": "x86-64", "aarch64": "generic"}
"""The architectures polyonnx generates code for, with the CPU a triple gets when none is
named: the baseline every machine of the architecture runs (x86-64: SSE2, no FMA;
aarch64: ARMv8.0-A with NEON). Not neoverse-n1 for aarch64: its code may use ARMv8.1's
atomics (LSE) for the worker pool's compare-and-swap, which a Cortex-A72 or A53 lacks, and
every aarch64 CPU gets the same schedules (4 float lanes, 32 registers)."""


def make_target(triple: str | None = None, cpu: str | None = None) -> Target:
    """The target of ``triple`` (an LLVM triple, the host's when None) and ``cpu`` (an LLVM
    CPU name such as "haswell", "znver4" or "neoverse-n1"). Without either, the host as
    :func:`host_target` sees it; ``cpu="native"`` is the host's CPU too. A triple named
    without a CPU gets its architecture's baseline (ARCHES), so that the code runs on any
    machine of it. Unknown or unsupported triples and CPUs raise TargetError."""
    if triple is None and cpu is None:
        return host_target()
    triple = triple or host_target().triple
    arch = _check_triple(triple)
    if cpu == "native":
        return _native(triple, arch)
    cpu = cpu or ARCHES[arch]
    _check_cpu(arch, cpu)
    return _cross_target(triple, arch, cpu)


def initialize_llvm_targets() -> None:
    """Every LLVM target and its assembly printer: code for another architecture needs
    them (``initialize_llvm`` sets up the host's only)."""
    _llvm().initialize_all_targets()
    _llvm().initialize_all_asmprinters()


def _check_triple(triple: str) -> str:
    """The architecture of a supported triple; TargetError saying why not."""
    parts = triple.split("-")
    arch = parts[0]
    if arch not in ARCHES:
        raise TargetError(
            f"target {triple!r}: polyonnx generates code for {' and '.join(ARCHES)} Linux "
            f"(e.g. x86_64-linux-gnu, aarch64-linux-gnu), not {arch!r}"
        )
    if "linux" not in parts[1:]:
        raise TargetError(
            f"target {triple!r}: polyonnx's runtime (its worker pool sleeps on Linux futexes) "
            f"needs a Linux triple, such as {arch}-linux-gnu"
        )
    initialize_llvm_targets()
    try:
        _llvm().Target.from_triple(triple)
    except RuntimeError as exc:
        raise TargetError(f"target {triple!r}: LLVM does not know it ({exc})") from exc
    return arch


def _native(triple: str, arch: str) -> Target:
    host = host_target()
    if arch != host.arch:
        raise TargetError(
            f"cpu 'native' is this machine's {host.name} ({host.arch}); the target {triple!r} "
            f"is {arch}: name its CPU, e.g. {ARCHES[arch]!r}"
        )
    return replace(host, triple=triple)


def _check_cpu(arch: str, cpu: str) -> None:
    """TargetError unless LLVM knows ``cpu`` for ``arch`` (an unknown one would make LLVM
    abort the process when it generates code)."""
    known = llvm_cpus(arch)
    if cpu in known:
        return
    other = [a for a in ARCHES if a != arch and cpu in llvm_cpus(a)]
    if other:
        hint = f"; it is an {other[0]} CPU (target {other[0]}-linux-gnu)"
    else:
        close = difflib.get_close_matches(cpu, sorted(known), n=4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise TargetError(f"cpu {cpu!r} is not an LLVM {arch} CPU{hint}")


@cache
def llvm_cpus(arch: str) -> frozenset[str]:
    """The CPU names LLVM knows for ``arch``. LLVM lists them (on stderr) once per process
    and aborts on an unknown CPU, so a child process asks it."""
    triple = f"{arch}-unknown-linux-gnu"
    features = "+64bit" if arch == "x86_64" else ""  # else LLVM aborts after the list
    done = subprocess.run(
        [sys.executable, "-c", _LIST_CPUS, triple, features],
        capture_output=True,
        text=True,
        check=False,
    )
    listing = done.stderr.partition("Available CPUs for this target:")[2]
    listing = listing.partition("Available features for this target:")[0]
    names = frozenset(line.split()[0] for line in listing.splitlines() if " - " in line)
    if not names:
        raise TargetError(f"could not list LLVM's {arch} CPUs: {done.stderr.strip()[-400:]}")
    return names


_LIST_CPUS = """
import sys
import llvmlite.binding as llvm
llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
module = llvm.parse_assembly("")
module.triple = sys.argv[1]
target = llvm.Target.from_triple(sys.argv[1])
target.create_target_machine(cpu="help", features=sys.argv[2]).emit_assembly(module)
"""


@cache
def _cross_target(triple: str, arch: str, cpu: str) -> Target:
    enabled = cpu_features(triple, cpu)
    if arch == "aarch64" and "neon" not in enabled:
        raise TargetError(f"cpu {cpu!r}: polyonnx's aarch64 code needs NEON")
    return Target(
        name=cpu,
        triple=triple,
        features=",".join(f"+{f}" for f in sorted(enabled)),
        vector_bits=_vector_bits(enabled),
        cores=1,  # unknown: another machine's
    )


@dataclass(frozen=True)
class Probe:
    """A feature polyonnx's code generation asks about, and a function whose code shows
    whether a CPU has it: ``instruction`` on operands ``%a, %b`` of ``type``, whose
    assembly matches ``pattern`` only with the feature."""

    feature: str
    type: str
    instruction: str
    pattern: str

    def function(self) -> str:
        t = self.type
        body = f"%r = {self.instruction.format(t=t)}\n  ret {t} %r"
        return f"define {t} @probe_{self.feature}({t} %a, {t} %b) {{\n  {body}\n}}"


PROBES = {
    "x86_64": (
        Probe("avx512f", "<16 x float>", "fadd {t} %a, %b", r"vaddps\s+%zmm"),
        Probe("avx", "<8 x float>", "fadd {t} %a, %b", r"vaddps\s+%ymm"),
        Probe("avx2", "<8 x i32>", "add {t} %a, %b", r"vpaddd\s+%ymm"),
        Probe("fma", "<4 x float>", "call {t} @llvm.fma.v4f32({t} %a, {t} %b, {t} %a)", "vfmadd"),
    ),
    "aarch64": (Probe("neon", "<4 x float>", "fadd {t} %a, %b", r"fadd\s+v\d+\.4s"),),
}
"""Per architecture, the features that decide the vector width (``_vector_bits``), the
register count (``Target.vector_registers``), AVX-512's vscalefps (emit/mathfn.py) and
whether llvm.fma is one instruction."""
FMA_DECLARATION = "declare <4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)"


def cpu_features(triple: str, cpu: str) -> frozenset[str]:
    """Which of its architecture's PROBES features LLVM's ``cpu`` has. llvmlite cannot ask
    LLVM what a named CPU implies, so LLVM's code generator answers: each probe's function
    compiled for the CPU, and the instruction the feature brings looked for in its code."""
    probes = PROBES[triple.split("-", 1)[0]]
    module = _llvm().parse_assembly("\n".join([*(p.function() for p in probes), FMA_DECLARATION]))
    module.triple = triple
    initialize_llvm_targets()
    machine = _llvm().Target.from_triple(triple).create_target_machine(cpu=cpu, reloc="pic")
    assembly = machine.emit_assembly(module)
    return frozenset(p.feature for p in probes if re.search(p.pattern, _code_of(assembly, p)))


def _code_of(assembly: str, probe: Probe) -> str:
    return assembly.split(f"\nprobe_{probe.feature}:", 1)[1].split(".Lfunc_end", 1)[0]


def _cache_sizes() -> dict[str, int]:
    """L1d/L2/L3 sizes from sysfs where Linux exposes them."""
    sizes: dict[str, int] = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    keys = {("1", "Data"): "l1d_bytes", ("2", "Unified"): "l2_bytes", ("3", "Unified"): "l3_bytes"}
    try:
        entries = os.listdir(base)
    except OSError:
        return sizes
    for entry in entries:
        try:
            level = _read(f"{base}/{entry}/level")
            kind = _read(f"{base}/{entry}/type")
            size = _read(f"{base}/{entry}/size")
        except OSError:
            continue
        key = keys.get((level, kind))
        if key and size.endswith("K"):
            sizes[key] = int(size[:-1]) * 1024
    return sizes


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()
