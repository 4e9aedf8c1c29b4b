"""A minimal PNG reader (8-bit greyscale, RGB or RGBA, not interlaced: what Chromium's
screenshots are) so that the browser test can count pixels without an imaging library."""

from __future__ import annotations

import struct
import zlib

import numpy as np

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def read_png(data: bytes) -> np.ndarray:
    """The image as a (height, width, channels) uint8 array."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, chunks, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in CHANNELS or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
    bpp = CHANNELS[colour]
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), dtype=np.uint8)
    raw = raw.reshape(height, 1 + width * bpp)
    image = np.zeros((height, width * bpp), dtype=np.uint8)
    previous = np.zeros(width * bpp, dtype=np.int64)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if kind == 0:
            row = line
        elif kind == 1:  # Sub: a running sum along each channel
            row = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) % 256
        elif kind == 2:  # Up
            row = (line + previous) % 256
        else:
            row = unfilter_sequential(kind, line, previous, bpp)
        image[y] = row
        previous = row
    return image.reshape(height, width, bpp)


def unfilter_sequential(kind: int, line: np.ndarray, up: np.ndarray, bpp: int) -> np.ndarray:
    """Average (3) and Paeth (4) depend on the reconstructed byte to the left."""
    row = np.zeros_like(line)
    for i in range(len(line)):
        left = int(row[i - bpp]) if i >= bpp else 0
        above = int(up[i])
        if kind == 3:
            predicted = (left + above) // 2
        elif kind == 4:
            corner = int(up[i - bpp]) if i >= bpp else 0
            estimate = left + above - corner
            pa, pb, pc = abs(estimate - left), abs(estimate - above), abs(estimate - corner)
            predicted = left if pa <= pb and pa <= pc else above if pb <= pc else corner
        else:
            raise ValueError(f"unknown PNG filter {kind}")
        row[i] = (line[i] + predicted) % 256
    return row
