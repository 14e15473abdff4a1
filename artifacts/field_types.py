"""Checking that a record read from JSON holds values of the types its dataclass declares.

``from_json`` builds records field by field without looking at the values: a manifest that says
``"batch": "4"`` or ``"shape": "abc"`` would build, and fail far away. ``check_field_types`` walks a
built record against the annotations of its dataclass (nested records, ``tuple[X, ...]``,
``Mapping[str, X]``, ``X | None``, enums, ``Any`` for free-form JSON) and raises ``ArtifactError``
naming the first field whose value is not of its type. ``int`` excludes ``bool``; ``float``
takes an int too and must be finite.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from grokc.core.errors import ArtifactError


def check_field_types(record: Any, where: str) -> None:
    """Raise ``ArtifactError`` unless every field of the dataclass ``record`` matches its annotation."""
    problem = _record_problem(record, "")
    if problem is not None:
        path, value, want = problem
        raise ArtifactError(f"{where} has {path.lstrip('.')} = {_short(value)}, which is not {want}; "
                            "rebuild the artifact")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _record_problem(record: Any, path: str) -> tuple[str, Any, str] | None:
    hints = _hints(type(record))
    for f in dataclasses.fields(record):
        problem = _problem(getattr(record, f.name), hints[f.name], f"{path}.{f.name}")
        if problem is not None:
            return problem
    return None


def _problem(value: Any, want: Any, path: str) -> tuple[str, Any, str] | None:
    """(path, value, what was wanted) of the first mismatch inside ``value``, or None."""
    origin, args = typing.get_origin(want), typing.get_args(want)
    if want is Any:
        return None if _is_json(value) else (path, value, "plain JSON data")
    if origin in (typing.Union, types.UnionType):
        problems = [_problem(value, a, path) for a in args]
        return None if any(p is None for p in problems) else (path, value, " or ".join(map(_name, args)))
    if origin is tuple:
        each = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if not isinstance(value, tuple) or len(each) != len(value):
            return path, value, _name(want)
        return next((p for i, (v, a) in enumerate(zip(value, each)) if (p := _problem(v, a, f"{path}[{i}]"))), None)
    if origin in (dict, Mapping, typing.Mapping) or want in (dict, Mapping):
        if not isinstance(value, Mapping):
            return path, value, "an object"
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path} key", k, "a string"
            if args and (p := _problem(v, args[1], f"{path}[{k!r}]")):
                return p
        return None
    if dataclasses.is_dataclass(want):
        return _record_problem(value, path) if isinstance(value, want) else (path, value, _name(want))
    if want is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else (path, value, "a finite number")
    if want is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else (path, value, "an integer")
    if isinstance(want, type) and issubclass(want, enum.Enum) or want in (str, bool, type(None)):
        return None if isinstance(value, want) else (path, value, _name(want))
    raise TypeError(f"check_field_types cannot check {want!r} ({path})")


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_json(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _name(want: Any) -> str:
    if want is type(None):
        return "null"
    if typing.get_origin(want) is tuple:
        args = typing.get_args(want)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_name(args[0])}"
        return f"a list of {len(args)} ({', '.join(map(_name, args))})"
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}.get(
        want, getattr(want, "__name__", str(want)))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
