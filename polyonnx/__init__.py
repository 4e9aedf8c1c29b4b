"""polyonnx: a polyhedral loop-optimising compiler for ONNX models."""

from polyonnx.errors import (
    ArgumentError,
    CodegenError,
    InputError,
    LoweringError,
    ModelError,
    PolyonnxError,
    RunError,
    ScheduleError,
    TargetError,
    TuningError,
    UnsupportedOpError,
)
from polyonnx.inference import InferenceSession
from polyonnx.program import Program, load
from polyonnx.schedule.schedule import Loop, Schedule

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "CodegenError",
    "InferenceSession",
    "InputError",
    "Loop",
    "LoweringError",
    "ModelError",
    "PolyonnxError",
    "Program",
    "RunError",
    "Schedule",
    "ScheduleError",
    "TargetError",
    "TuningError",
    "UnsupportedOpError",
    "__version__",
    "load",
]
