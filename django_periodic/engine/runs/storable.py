"""What a run row can store of a job's result and error texts, on every database.

One rule for results and error texts (docs/semantics.md, "What is stored"): PostgreSQL
refuses NUL characters in text and jsonb, and NaN or Infinity in jsonb; no database driver
sends a lone surrogate (such as a file name's undecodable byte under Python's
surrogateescape); a result without a JSON form, or too long, is stored as a note.
"""

import json
import math
import re
from typing import Any, cast

from django.core.serializers.json import DjangoJSONEncoder

from django_periodic.conf import get_settings
from django_periodic.models import Run

REPLACEMENT_CHARACTER = "\ufffd"
NOT_JSON_NOTE = "result is not JSON-serializable"
# A longer error code (an exception's class name) is cut to what its column holds.
ERROR_CODE_MAX_LENGTH = cast(int, Run._meta.get_field("error_code").max_length)
_UNSTORABLE_CHARACTERS = re.compile("[\x00\ud800-\udfff]")
# NUL as JSON writes it, "\u0000", but not an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
# NaN and the infinities as PostgreSQL's to_jsonb() writes them (and Django's encoder a
# Decimal's).
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def storable_text(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` as stored: its first ``limit`` characters (the last, with ``keep_end``),
    with each NUL and lone surrogate replaced by U+FFFD."""
    if len(text) > limit:
        text = text[-limit:] if keep_end else text[:limit]
    return _UNSTORABLE_CHARACTERS.sub(REPLACEMENT_CHARACTER, text)


def storable_result(result: Any) -> Any:
    """``result`` as stored in ``Run.result``: its JSON (Django's encoder), with NaN and
    the infinities as the strings "NaN", "Infinity" and "-Infinity" and each NUL and lone
    surrogate, in keys and values alike, replaced by U+FFFD.

    A result with no JSON form is stored as ``{"repr": ..., "note": NOT_JSON_NOTE}``; one
    whose JSON is longer than ``RESULT_MAX_BYTES`` as ``{"preview": <its first
    RESULT_MAX_BYTES bytes>, "note": "result truncated from <N> bytes"}``.
    """
    text = storable_json(result)
    return None if text is None else json.loads(text)


def storable_json(result: Any) -> str | None:
    """What ``storable_result`` stores, as JSON text: what a statement sends, encoded once
    (None for a result of None)."""
    if result is None:
        return None
    limit = get_settings().RESULT_MAX_BYTES
    try:
        text = _json_text(result)
    except Exception:  # a type the encoder does not know, a cycle, a too long int...
        return _dumps({"repr": storable_text(_repr(result), limit), "note": NOT_JSON_NOTE})
    # Lone surrogates are in the text as they are, NUL escaped (JSON escapes controls).
    text = _UNSTORABLE_CHARACTERS.sub(REPLACEMENT_CHARACTER, text)
    if "\\u0000" in text:
        text = _NUL_ESCAPE.sub(lambda match: match[1] + REPLACEMENT_CHARACTER, text)
    encoded = text.encode()
    if len(encoded) > limit:
        preview = encoded[:limit].decode(errors="ignore")
        return _dumps({"preview": preview, "note": f"result truncated from {len(encoded)} bytes"})
    return text


def _json_text(value: Any) -> str:
    try:
        return _dumps(value)
    except ValueError:  # NaN or an infinity in it (a cycle fails again)
        return _dumps(_finite(value))


def _dumps(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False, allow_nan=False)


def _finite(value: Any) -> Any:
    """``value`` with each NaN or infinite float in it, a dict key too, as its string."""
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[repr(float(value))]
    if isinstance(value, dict):
        return {_finite(key): _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object whose repr() failed>"
