"""``polyonnx.InferenceSession``: the runtime's session with tuning records loaded.

The runtime runs what it is handed and imports no tuner; this module, above both, reads
the records (``tuning_db``) and hands them to it.
"""

from __future__ import annotations

import os

from polyonnx.runtime import session as runtime
from polyonnx.runtime.library import is_library


class InferenceSession(runtime.InferenceSession):
    def __init__(
        self,
        model,
        threads: int | None = None,
        *,
        tuning_db: str | os.PathLike | bool | None = None,
        **options,
    ):
        """As polyonnx.runtime.session.InferenceSession, and ``tuning_db``: a database of
        ``polyonnx tune`` whose best records (measured on this machine, faster than the
        default) schedule their kernels; the records shipped with polyonnx for this CPU
        apply too unless ``tuning_db=False``."""
        records = None
        if tuning_db is not False and not is_library(model):
            records = load_records(tuning_db, runtime.thread_count(threads))
        super().__init__(model, threads, records=records, **options)


def load_records(tuning_db: str | os.PathLike | bool | None, threads: int):
    """The records of ``tuning_db`` (None or True: the shipped records only)."""
    from polyonnx.tune.apply import Records

    return Records.load(threads, None if tuning_db in (None, True) else tuning_db)
