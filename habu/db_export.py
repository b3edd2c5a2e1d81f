"""The plan-export file (`habu plans export`): its JSON schema, and reading one without trusting it.

An export comes from someone else's machine. Reading it never raises anything but a one-line
`HabuError`: the bytes must be UTF-8 JSON (no BOM, no NaN or Infinity, no number too long to
convert, no nesting deep enough to exhaust the parser), and the whole document must match
`EXPORT_SCHEMA` (every field present, none extra, every number in its range) before anything of it
is used. What the schema cannot say (that a plan is a plan Habu reads and proves) the importer
checks next, still before writing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from habu.errors import HabuError

EXPORT_FORMAT = 1  # the `habu_plans` field
MAX_EXPORT_BYTES = 256 * 2**20

_TIME = {"type": "number", "minimum": 0}
_MICROSECONDS = {"type": ["number", "null"], "minimum": 0}
_TEXT = {"type": "string", "maxLength": 4096}
_JSON_OBJECT = {"type": "object"}

_KEY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["model_hash", "model", "shape", "dtypes", "target", "versions"],
    "properties": {
        "model_hash": {"type": "string", "pattern": "^[0-9a-zA-Z]{16,128}$"},
        "model": {**_TEXT, "minLength": 1},
        "shape": {"type": "array", "items": {"type": "array", "minItems": 2, "items": False,
                                             "prefixItems": [{**_TEXT, "minLength": 1},
                                                             {"type": "integer", "minimum": 1, "maximum": 2**40}]}},
        "dtypes": {"type": "array", "items": {"type": "array", "minItems": 2, "items": False,
                                              "prefixItems": [{**_TEXT, "minLength": 1}, _TEXT]}},
        "target": {"type": "object", "additionalProperties": False, "required": ["arch", "gpu", "sm_count"],
                   "properties": {"arch": _TEXT, "gpu": _TEXT, "sm_count": {"type": "integer", "minimum": 0}}},
        "versions": {"type": "object", "additionalProperties": False, "required": ["habu", "nvrtc", "driver"],
                     "properties": {"habu": _TEXT, "nvrtc": _TEXT, "driver": _TEXT}},
        "direction": {"enum": ["forward", "backward"]},  # absent in files written before it existed
        "ranges": {"type": "array", "items": {"type": "array", "minItems": 3, "items": False,
                                              "prefixItems": [{**_TEXT, "minLength": 1},
                                                              {"type": "integer", "minimum": 1, "maximum": 2**40},
                                                              {"type": "integer", "minimum": 1, "maximum": 2**40}]}},
    },
}

_RECORD_FIELDS = ("rank", "plan", "status", "median_us", "p20_us", "p80_us", "samples_us", "predicted_us",
                  "certificate", "resources", "golden", "provenance")
_RECORD = {
    "type": "object",
    "additionalProperties": False,
    "required": list(_RECORD_FIELDS),
    "properties": {
        "rank": {"type": "integer", "minimum": 0},
        "plan": _JSON_OBJECT,
        "status": {"enum": ["measured", "unmeasured"]},
        "median_us": _MICROSECONDS,
        "p20_us": _MICROSECONDS,
        "p80_us": _MICROSECONDS,
        "samples_us": {"type": "array", "items": {"type": "number", "minimum": 0}},
        "predicted_us": _MICROSECONDS,
        "certificate": {"type": ["object", "null"]},
        "resources": {"type": ["object", "null"]},
        "golden": {"type": ["object", "null"]},
        "provenance": _JSON_OBJECT,
    },
}

_FAILURE = {"type": "object", "additionalProperties": False, "required": ["plan", "reason", "at"],
            "properties": {"plan": _TEXT, "reason": {"type": "string"}, "at": _TIME}}

EXPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["habu_plans", "exported", "entries"],
    "properties": {
        "habu_plans": {"const": EXPORT_FORMAT},
        "exported": _TIME,
        "entries": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["key", "created", "updated", "records", "failures"],
            "properties": {"key": _KEY, "created": _TIME, "updated": _TIME,
                           "records": {"type": "array", "items": _RECORD},
                           "failures": {"type": "array", "items": _FAILURE}},
        }},
    },
}


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is too large")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_export(path: Path) -> dict[str, Any]:
    """The export at `path`, parsed and checked against `EXPORT_SCHEMA`; a `HabuError` otherwise."""
    what = f"{path} is not a Habu plan export"
    try:
        if path.stat().st_size > MAX_EXPORT_BYTES:
            raise HabuError(f"{what}: larger than {MAX_EXPORT_BYTES // 2**20} MiB")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HabuError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise HabuError(f"{path} is a directory, not a Habu plan export") from None
    except OSError as exc:
        raise HabuError(f"cannot read {path}: {exc.strerror or exc}") from None
    if raw.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")):
        raise HabuError(f"{what}: it starts with a byte-order mark (an export is UTF-8 without one)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HabuError(f"{what}: byte {exc.start} (0x{raw[exc.start]:02x}) is not UTF-8") from None
    try:
        data = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise HabuError(f"{what}: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise HabuError(f"{what}: its JSON is nested too deeply") from None
    except ValueError as exc:  # a number with too many digits, NaN, Infinity
        raise HabuError(f"{what}: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(data, dict):
        raise HabuError(f"{what}: the file holds a JSON {type(data).__name__}, not an object")
    if "habu_plans" in data and data["habu_plans"] != EXPORT_FORMAT:
        raise HabuError(f"{path} is a Habu plan export of another format ({str(data['habu_plans'])[:20]}); "
                        f"this Habu reads format {EXPORT_FORMAT}")
    _validate(data, what)
    return data


def _validate(data: dict[str, Any], what: str) -> None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    try:
        error = best_match(Draft202012Validator(EXPORT_SCHEMA).iter_errors(data))
    except RecursionError:
        raise HabuError(f"{what}: its JSON is nested too deeply") from None
    if error is None:
        return
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
    raise HabuError(f"{what}: {'at ' + where + ': ' if where else ''}{message}")


__all__ = ["EXPORT_FORMAT", "EXPORT_SCHEMA", "parse_export"]
