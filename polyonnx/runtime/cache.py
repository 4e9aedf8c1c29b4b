"""The compile cache: native code and constants of compiled models, on disk.

An entry is one file named by the key of everything that changes the code (the model's
bytes, input shapes and values, the target CPU and its features, the polyonnx and LLVM
versions, the tuning records in force, profiling). It holds the object files, the entry's
ABI and the constants, each at a cache-line offset, and starts with a CRC-32 of the rest:
a truncated or damaged entry fails the check and is compiled again, never loaded. CRC-32
is the fastest check Python has (docs/measurements.md, 'Cache entry checksum'); it
detects damage, not tampering: the cache directory is the user's own. Entries
are written to a temporary name and renamed into place, so processes compiling the same
model at once all succeed. Past the size cap the least recently used entries go.

Where: ``POLYONNX_CACHE_DIR``, else ``$XDG_CACHE_HOME/polyonnx``, else ``~/.cache/polyonnx``.
``POLYONNX_CACHE=off`` turns it off by default (the tests do); ``POLYONNX_CACHE_BYTES``
sets the cap (default CAP_BYTES).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyonnx.emit.abi import EntryAbi

MAGIC = b"POLYONNX-CACHE\x00\x03"
"""Its last byte is the format's version: 3 since the entry's code takes an error record
and its ABI lists the run-time checks (emit/abi.py), which no older entry has."""
SUFFIX = ".entry"
CHECK_BYTES = 8
CAP_BYTES = 4 << 30
"""A light ResNet-50's entry is about 110 MB (its packed weights): some thirty models."""
ALIGN = 64


@dataclass(frozen=True)
class Entry:
    """What one cache entry holds."""

    abi: EntryAbi
    objects: tuple[bytes, ...]
    constants: Mapping[str, np.ndarray]
    extra: Mapping[str, object]
    """Small JSON data kept beside the code (memory use, tuned kernels)."""


@dataclass(frozen=True)
class CacheInfo:
    directory: Path
    entries: int
    bytes: int
    cap_bytes: int


def cache_directory() -> Path:
    configured = os.environ.get("POLYONNX_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "polyonnx"


def enabled_by_default() -> bool:
    return os.environ.get("POLYONNX_CACHE", "").lower() not in ("off", "0", "false", "no")


def cap_bytes() -> int:
    return int(os.environ.get("POLYONNX_CACHE_BYTES", CAP_BYTES))


def cache_key(parts: Mapping[str, object]) -> str:
    """The key of a compile: SHA-256 of its parts as canonical JSON."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class CompileCache:
    """Entries under ``directory``, capped at ``cap`` bytes in all."""

    def __init__(self, directory: str | os.PathLike | None = None, cap: int | None = None):
        self.directory = Path(directory) if directory is not None else cache_directory()
        self.cap = cap_bytes() if cap is None else cap

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def load(self, key: str) -> Entry | None:
        """The entry of ``key``, or None if there is none or it fails its checksum (then
        it is removed)."""
        path = self.path(key)
        try:
            entry = _read(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, struct.error):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be evicted
        return entry

    def store(self, key: str, entry: Entry | None) -> Path | None:
        """Write ``entry`` atomically, then evict past the cap; None if there is nothing
        to store or the directory cannot be written (the cache then just does not help)."""
        if entry is None:
            return None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                _write(f, entry)
            os.replace(temp, self.path(key))
        except OSError:
            return None
        self.evict()
        return self.path(key)

    def entries(self) -> list[Path]:
        try:
            return [p for p in self.directory.iterdir() if p.suffix == SUFFIX]
        except FileNotFoundError:
            return []

    def evict(self) -> None:
        """Remove least recently used entries until the rest fit the cap."""
        stats = []
        for path in self.entries():
            try:
                stats.append((path.stat().st_mtime_ns, path.stat().st_size, path))
            except FileNotFoundError:
                continue
        total = sum(size for _, size, _ in stats)
        for _, size, path in sorted(stats):
            if total <= self.cap:
                break
            path.unlink(missing_ok=True)
            total -= size

    def info(self) -> CacheInfo:
        sizes = []
        for path in self.entries():
            try:
                sizes.append(path.stat().st_size)
            except FileNotFoundError:
                continue
        return CacheInfo(self.directory, len(sizes), sum(sizes), self.cap)

    def clear(self) -> int:
        """Remove every entry (and stale temporary files); how many entries went."""
        removed = 0
        for path in self.entries():
            path.unlink(missing_ok=True)
            removed += 1
        if self.directory.is_dir():
            for temp in self.directory.glob(".tmp-*"):
                temp.unlink(missing_ok=True)
        return removed


def _write(f, entry: Entry) -> None:
    """MAGIC, CRC-32 of what follows (8 bytes), header length, JSON header, then the
    object files and the constants, each starting on an ALIGN-byte offset of the file.
    The parts are written from their own memory, the CRC computed on the way and written
    last: joining a BERT-base's 740 MB into one bytes object took 5 s."""
    parts: list[memoryview] = []
    layout: dict[str, list] = {}
    at = 0

    def place(data) -> int:
        nonlocal at
        view = memoryview(data).cast("B")
        start = at
        parts.extend([view, memoryview(b"\0" * (-len(view) % ALIGN))])
        at += len(view) + len(parts[-1])
        return start

    objects = [[place(obj), len(obj)] for obj in entry.objects]
    for name, array in entry.constants.items():
        array = np.ascontiguousarray(array)
        flat = array.reshape(-1).view(np.uint8) if array.size else b""
        layout[name] = [place(flat), array.dtype.name, list(array.shape)]
    header = {
        "abi": json.loads(entry.abi.to_json()),
        "objects": objects,
        "constants": layout,
        "extra": dict(entry.extra),
    }
    head = json.dumps(header).encode()
    pad = -(len(MAGIC) + CHECK_BYTES + 8 + len(head)) % ALIGN
    first = struct.pack("<Q", len(head) + pad) + head + b" " * pad
    f.write(MAGIC + bytes(CHECK_BYTES))
    check = 0
    for part in (memoryview(first), *parts):
        check = zlib.crc32(part, check)
        f.write(part)
    f.seek(len(MAGIC))
    f.write(struct.pack("<Q", check))


def _read(path: Path) -> Entry:
    """Map ``path`` and check it; constants are read-only views of the mapping."""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(data)
    head_at = len(MAGIC) + CHECK_BYTES
    if len(data) < head_at + 8 or view[: len(MAGIC)] != MAGIC:
        raise ValueError("not a polyonnx cache entry")
    (check,) = struct.unpack_from("<Q", data, len(MAGIC))
    if zlib.crc32(view[head_at:]) != check:
        raise ValueError("checksum mismatch")
    (head_bytes,) = struct.unpack_from("<Q", data, head_at)
    payload = head_at + 8 + head_bytes
    header = json.loads(bytes(view[head_at + 8 : payload]))
    constants = {}
    for name, (at, dtype, shape) in header["constants"].items():
        count = int(np.prod(shape, dtype=np.int64))
        array = np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=payload + at)
        constants[name] = array.reshape(shape)
    return Entry(
        abi=EntryAbi.from_json(json.dumps(header["abi"])),
        objects=tuple(
            bytes(view[payload + at : payload + at + size]) for at, size in header["objects"]
        ),
        constants=constants,
        extra=header["extra"],
    )
