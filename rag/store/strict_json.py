"""JSON that every reader accepts: result files never hold the non-standard tokens `NaN`,
`Infinity` or `-Infinity` that Python's json module writes by default.

Inside ragrig a float NaN means "no value" (a metric a question has no data for); in a result file
that is `null`, which JavaScript (report.html), jq, pandas and every other JSON parser read. An
infinite value has no meaning in a result either and is written as `null` too: the served values
that could carry one (scores, vectors) are refused where they arrive (rag.endpoint's callers),
so this is the last net, not the check.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (Python or NumPy) replaced by None and NumPy scalars and
    arrays turned into Python values; containers are copied, everything else is returned as is."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite(obj.tolist())
    if isinstance(obj, np.generic):
        return finite(obj.item())
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of `finite(obj)` with allow_nan=False: a value that would still need a
    non-standard token is an error here, not a file no reader can parse."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
