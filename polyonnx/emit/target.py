"""What CPU we generate code for: name, triple, features, vector width, caches."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm


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
    def key(self) -> str:
        """Identifies code compatibility: same key, same generated code."""
        return f"{self.name}:{self.vector_bits}"


def initialize_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def llvm_version() -> str:
    """The version of the LLVM that llvmlite links, e.g. "22.1.0"."""
    return ".".join(str(part) for part in llvm.llvm_version_info)


@cache
def host_target() -> Target:
    """The machine we run on, as llvmlite sees it."""
    initialize_llvm()
    features = llvm.get_host_cpu_features().flatten()
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in enabled:
        bits = 512
    elif "avx2" in enabled or "avx" in enabled:
        bits = 256
    else:
        bits = 128
    return Target(
        name=llvm.get_host_cpu_name(),
        triple=llvm.get_process_triple(),
        features=features,
        vector_bits=bits,
        cores=os.cpu_count() or 1,
        **_cache_sizes(),
    )


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
