"""The C compiler and linker that turn a model's object file into a shared library.

For the host, the system's ``cc`` (or ``$CC``). For another architecture, its cross gcc
where one is installed (Debian's ``gcc-aarch64-linux-gnu``), else ``zig cc`` from the
``ziglang`` package on PyPI (``pip install "polyonnx[cross]"``): one pip install that
brings a C compiler, a linker and the C library's stubs for every Linux target, with no
system package. docs/deploy.md says why.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

from polyonnx.errors import CodegenError

ZIG_TARGETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}


@dataclass(frozen=True)
class Toolchain:
    """A C compiler driver that also links: ``command`` then the usual cc flags."""

    command: tuple[str, ...]
    description: str

    def run(self, arguments: list[str], cwd: str) -> None:
        done = subprocess.run(
            [*self.command, *arguments], cwd=cwd, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise CodegenError(
                f"{self.description} failed ({' '.join([*self.command, *arguments])}):\n"
                f"{done.stderr.strip() or done.stdout.strip()}"
            )


def arch_of(triple: str) -> str:
    return triple.split("-")[0]


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def find_toolchain(triple: str) -> Toolchain:
    """The toolchain for ``triple``, or a CodegenError saying what to install."""
    arch = arch_of(triple)
    if arch == host_arch():
        native = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if native:
            return Toolchain((native,), f"the C compiler {native}")
    else:
        cross = shutil.which(f"{arch}-linux-gnu-gcc")
        if cross:
            return Toolchain((cross,), f"the cross compiler {cross}")
    if arch in ZIG_TARGETS and importlib.util.find_spec("ziglang") is not None:
        command = (sys.executable, "-m", "ziglang", "cc", "-target", ZIG_TARGETS[arch])
        return Toolchain(command, f"zig cc for {ZIG_TARGETS[arch]}")
    raise CodegenError(_missing(arch))


def _missing(arch: str) -> str:
    if arch not in ZIG_TARGETS:
        return f"polyonnx cannot link libraries for {arch!r}: it knows x86_64 and aarch64"
    if arch == host_arch():
        return (
            "linking the library needs a C compiler: install one (apt-get install gcc), "
            'or pip install "polyonnx[cross]", which brings zig cc'
        )
    return (
        f"linking a library for {arch} needs a cross toolchain: "
        f'pip install "polyonnx[cross]" (zig cc: a 100 MB download, no system package) or '
        f"apt-get install gcc-{arch}-linux-gnu"
    )
