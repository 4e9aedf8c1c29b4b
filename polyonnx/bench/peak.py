"""The fp32 FMA peak of one core, which contractions' GFLOP/s are compared with:

    peak = FMA pipes x fp32 lanes per pipe x 2 flops x clock

The pipes and lanes come from polyonnx's target (the CPU llvmlite detects), the clock from
sysfs (cpufreq's maximum); where sysfs has none (a VM), from a measured FMA loop
(emit/fmapeak.py): the clock at which these pipes give the loop's GFLOP/s.
"""

from __future__ import annotations

import functools
import pathlib
import re

from polyonnx.bench.cases import Row

FMA_PIPES = 2
DATAPATH_BITS = {"znver4": 256}
"""CPUs whose FMA pipes are narrower than their registers: Zen 4 runs each 512-bit FMA as
two halves on its two 256-bit pipes."""


def clock() -> tuple[float, str]:
    """(GHz, where it came from)."""
    path = pathlib.Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(path.read_text()) / 1e6, "sysfs cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    return measured_clock()


@functools.cache
def measured_clock() -> tuple[float, str]:
    """The clock implied by a measured FMA loop on this core (see the module docstring)."""
    from polyonnx.emit.fmapeak import fma_peak_gflops
    from polyonnx.target import host_target

    target = host_target()
    rate = fma_peak_gflops(target)
    ghz = rate / (FMA_PIPES * _fma_lanes(target) * 2)
    note = f"measured: an FMA loop ran at {rate:.1f} GFLOP/s on one core (best of 5)"
    current = cpuinfo_mhz()
    if current:
        note += f"; /proc/cpuinfo says {current:.0f} MHz, in a VM the nominal clock"
    return ghz, note


def cpuinfo_mhz() -> float | None:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    found = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    return float(found[1]) if found else None


def peak_per_core(ghz: float) -> tuple[float, str]:
    """fp32 GFLOP/s of one core of this machine at ``ghz``, and how it was computed."""
    from polyonnx.target import host_target

    target = host_target()
    lanes = _fma_lanes(target)
    peak = FMA_PIPES * lanes * 2 * ghz
    how = (
        f"{target.name}, {target.vector_bits}-bit vectors: {FMA_PIPES} FMA pipes x {lanes} "
        f"fp32 lanes x 2 flops x {ghz:.2f} GHz = {peak:.1f} GFLOP/s per core"
    )
    return peak, how


def _fma_lanes(target) -> int:
    """fp32 lanes of one FMA pipe."""
    return DATAPATH_BITS.get(target.name, target.vector_bits) // 32


def fastest(rows: list[Row]) -> tuple[float, str, Row | None]:
    """(GFLOP/s per core, implementation, row) of the fastest contraction measured."""
    rates = [
        (row.flops / t / 1e9 / row.threads, impl, row)
        for row in rows
        if row.flops
        for impl, t in row.medians.items()
    ]
    return max(rates, key=lambda rate: rate[0], default=(0.0, "", None))
