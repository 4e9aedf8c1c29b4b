"""polyonnx: a polyhedral loop-optimising compiler for ONNX models."""

from polyonnx.errors import (
    CodegenError,
    InputError,
    LoweringError,
    ModelError,
    PolyonnxError,
    ScheduleError,
    TuningError,
    UnsupportedOpError,
)
from polyonnx.runtime.session import InferenceSession

__version__ = "0.1.0"

__all__ = [
    "CodegenError",
    "InferenceSession",
    "InputError",
    "LoweringError",
    "ModelError",
    "PolyonnxError",
    "ScheduleError",
    "TuningError",
    "UnsupportedOpError",
    "__version__",
]
