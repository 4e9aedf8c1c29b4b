"""``polyonnx.InferenceSession``: the runtime's session with tuning records loaded.

The runtime runs what it is handed and imports no tuner; this module, above both, reads
the records (``tuning_db``) and hands them to it.
"""

from __future__ import annotations

import os

from polyonnx.errors import ArgumentError
from polyonnx.runtime import session as runtime
from polyonnx.runtime.arguments import keywords, model_argument, path_option
from polyonnx.runtime.library import is_library

OPTIONS = {
    "target": "a polyonnx.target.Target",
    "profile": "True or False",
    "cache": "True, False or a directory",
    "limits": "a polyonnx.frontend.limits.Limits",
    "checks": "True or False",
    "specialize": "symbolic dim name -> list of sizes",
}
"""The keywords passed on to the runtime's session, and what each takes."""


class InferenceSession(runtime.InferenceSession):
    def __init__(
        self,
        model,
        threads: int | None = None,
        *extra,
        tuning_db: str | os.PathLike | bool | None = None,
        **options,
    ):
        """As polyonnx.runtime.session.InferenceSession, and ``tuning_db``: a database of
        ``polyonnx tune`` whose best records (measured on this machine, faster than the
        default) schedule their kernels; the records shipped with polyonnx for this CPU
        apply too unless ``tuning_db=False``. ``threads``: a positive int, or None for one
        per core. Every argument is checked before anything is loaded: a bad model raises
        ModelError, any other bad argument ArgumentError (both PolyonnxErrors)."""
        model_argument(model)
        count = runtime.thread_count(threads)
        if extra:
            raise ArgumentError(
                f"InferenceSession takes the model and threads positionally, given "
                f"{2 + len(extra)} positional arguments; pass the others by keyword "
                "(onnxruntime's sess_options and providers are not polyonnx's)"
            )
        keywords(options, {**OPTIONS, "tuning_db": "True, False or a database path"})
        tuning_db = path_option("tuning_db", tuning_db, directory=False)
        records = None
        if tuning_db is not False and not is_library(model):
            records = load_records(tuning_db, count)
        super().__init__(model, count, records=records, **options)


def load_records(tuning_db: str | os.PathLike | bool | None, threads: int):
    """The records of ``tuning_db`` (None or True: the shipped records only)."""
    from polyonnx.tune.apply import Records

    return Records.load(threads, None if tuning_db in (None, True) else tuning_db)
