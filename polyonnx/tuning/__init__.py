"""Tuning records shipped with polyonnx (JSON lines, one file per CPU target), applied by
default when this machine's key matches theirs. The repository's top-level ``tuning/``
is this folder; its README.md describes the record format."""
