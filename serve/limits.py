"""The server's hard limits: what a request may ask for and how much work may wait.

Set by ``grokc serve`` flags or a config file (``--config FILE``: TOML with a ``[limits]`` table of
these names, or the same as JSON, ``{"limits": {...}}``, in a ``.json`` file; a flag wins over the file). Every limit is checked before a request touches the
device; ``resolve`` fills the ones left unset from the artifact's shapes and refuses values the
artifact cannot serve.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grokc.core.errors import GrokcError
from grokc.core.meta import Shapes


class ServeConfigError(GrokcError):
    """A server option or config file entry is missing, unknown or out of range."""


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int | None = None   # None: the artifact's largest bucket (never more)
    max_new_tokens: int | None = None      # largest max_tokens a request may ask; None: max_seq - 1
    max_queue: int = 64                    # requests waiting for a slot; one more gets 429
    request_timeout_s: float = 60.0        # arrival to last token; past it 504 (the slot is freed)
    max_body_bytes: int = 1 << 20          # a larger request body gets 413
    max_stop: int = 4                      # stop strings per request
    max_stop_chars: int = 256              # characters per stop string
    retry_after_s: int = 1                 # Retry-After of a 429
    drain_timeout_s: float = 30.0          # after SIGTERM, how long requests in flight may still run

    def resolve(self, shapes: Shapes) -> "Limits":
        """These limits with the unset ones filled from ``shapes``; refuses values out of range."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ServeConfigError(f"limit {f.name} = {value!r} must be a number")
            if value <= 0:
                raise ServeConfigError(f"limit {f.name} = {value} must be positive")
            if f.type.startswith("int") and value != int(value):
                raise ServeConfigError(f"limit {f.name} = {value} must be a whole number")
        biggest = shapes.buckets[-1]
        prompt = biggest if self.max_prompt_tokens is None else int(self.max_prompt_tokens)
        if prompt > biggest:
            raise ServeConfigError(f"max_prompt_tokens = {prompt} exceeds the artifact's largest bucket ({biggest}); "
                                   f"use {biggest} or less, or rebuild with a larger --buckets entry")
        new = shapes.max_seq - 1 if self.max_new_tokens is None else int(self.max_new_tokens)
        if new >= shapes.max_seq:
            raise ServeConfigError(f"max_new_tokens = {new} leaves no room for a prompt in the artifact's context of "
                                   f"{shapes.max_seq}; use {shapes.max_seq - 1} or less")
        return dataclasses.replace(self, max_prompt_tokens=prompt, max_new_tokens=new)


def load_limits(config: Path | None, overrides: dict[str, Any]) -> Limits:
    """The ``[limits]`` table of ``config`` (TOML) with ``overrides`` (flags; None = not given) on top."""
    values: dict[str, Any] = {}
    if config is not None:
        doc = _read_config(config)
        unknown_tables = sorted(set(doc) - {"limits"})
        if unknown_tables or not isinstance(doc.get("limits", {}), dict):
            raise ServeConfigError(f"the config file {config} must hold one table, limits (it has {sorted(doc)})")
        values = dict(doc.get("limits", {}))
    values.update({k: v for k, v in overrides.items() if v is not None})
    names = {f.name for f in dataclasses.fields(Limits)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ServeConfigError(f"unknown limits {unknown}; the limits are: {', '.join(sorted(names))}")
    return Limits(**values)


def _read_config(path: Path) -> dict:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ServeConfigError(f"cannot read the config file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ServeConfigError(f"the config file {path} is not valid JSON: {exc}") from None
    else:
        try:
            import tomllib  # Python 3.11+
        except ImportError:
            raise ServeConfigError(f"reading TOML ({path}) needs Python 3.11 or later; give a .json file") from None
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ServeConfigError(f"the config file {path} is not valid TOML: {exc}") from None
    if not isinstance(doc, dict):
        raise ServeConfigError(f"the config file {path} must hold a table (an object), not {type(doc).__name__}")
    return doc
