"""JSON as artifacts store it, and as recast reads it back from a file: metadata values written with
sorted keys and no NaN or inf (:func:`json_dumps`), read with their nesting bounded before the parser
sees them (:func:`json_loads`: 200 000 nested ``[`` would exhaust the parser's stack)."""

from __future__ import annotations

import json
import re
from typing import Any

from recast_cli.errors import BadInput

#: The deepest nesting of arrays and objects a metadata value may have. recast writes at most a few
#: levels; 200 000 nested ``[`` would exhaust the JSON parser's stack (a RecursionError traceback).
MAX_JSON_DEPTH = 64
#: A JSON string literal (its brackets are text, not nesting); the closing quote is optional so that an
#: unterminated string is consumed in one pass (else each of its quotes restarts the match: quadratic).
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)


def json_too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the arrays and objects of the JSON text ``raw`` nest deeper than ``limit``, told
    without parsing it: brackets inside strings are skipped (an unterminated string counts as text)."""
    import numpy as np

    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if data.count(b"[") + data.count(b"{") <= limit:
        return False  # too few brackets to nest that deep: no scan needed
    codes = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    step = ((codes == ord("[")) | (codes == ord("{"))).astype(np.int64) - ((codes == ord("]")) | (codes == ord("}")))
    return int(np.cumsum(step).max(initial=0)) > limit


def json_loads(raw: bytes | str, where: str) -> Any:
    """``json.loads(raw)`` for metadata read from a file: BadInput (naming ``where``) when it nests
    deeper than :data:`MAX_JSON_DEPTH`, before the parser sees it. Malformed JSON raises
    ``json.JSONDecodeError`` as ``json.loads`` does (callers name what was malformed)."""
    if json_too_deep(raw):
        raise BadInput(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels (not written by recast)")
    return json.loads(raw)


def json_dumps(value: Any) -> str:
    """A metadata value as artifacts store it: JSON with sorted keys, no NaN or inf."""
    return json.dumps(value, sort_keys=True, allow_nan=False)
