"""A ``.pt2`` archive screened before ``torch.export.load`` reads it.

``torch.export.load`` trusts its file ("never load data from an untrusted source"): it unpickles
members with ``torch.load(weights_only=False)`` or ``pickle.loads``, loads AOTInductor shared
libraries, and parses the program's symbolic shapes with ``sympy.sympify`` (an ``eval``). A model
file downloaded from somewhere must not run code at build, so ``check_archive`` refuses, with one
``UnsupportedModel`` line naming the member, an archive that:

- is not a zip file, or names a member with an absolute path, a ``..`` or a backslash;
- holds AOTInductor code (``data/aotinductor/``) or object constants (``custom_obj_*``,
  ``opaque_obj_*``), which grokc never needs;
- holds a pickle (every ``*.pt`` member, every weight or constant saved with ``use_pickle``) that
  ``torch.load(weights_only=True)`` refuses: one that would import or call anything but tensors;
- holds a symbolic expression (``expr_str`` in the program's JSON) that ``sym_expr.is_plain``
  refuses (anything but sympy arithmetic on symbols), or a JSON member that is not JSON.

A plain ``torch.export.save`` of a model's tensors passes. Nothing here unpickles with code.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from grokc.compiler.frontends.torch_export.sym_expr import is_plain
from grokc.core.errors import UnsupportedModel


def check_archive(path: Path) -> None:
    """Refuse the ``.pt2`` file ``path`` if loading it could run code or read outside it (module doc)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnsupportedModel(f"cannot read '{path}' as a torch.export program ({exc}); save it with "
                               "torch.export.save") from exc
    with zf:
        for member in zf.namelist():
            _check_member(path, zf, member)


def _check_member(path: Path, zf: zipfile.ZipFile, member: str) -> None:
    where = f"torch.export program '{path.name}' holds '{member}'"
    if member.startswith("/") or "\\" in member or ".." in member.split("/"):
        raise UnsupportedModel(f"{where}, a member that is not a plain relative path; save the program again "
                               "with torch.export.save")
    record = member.split("/", 1)[-1]   # the archive's records lie in one top folder
    if record.startswith("data/aotinductor/"):
        raise UnsupportedModel(f"{where}, AOTInductor code, which grokc does not load; save the exported program "
                               "alone with torch.export.save")
    if record.endswith(".pt"):
        _check_pickle(where, zf.read(member))
    if record.endswith(".json"):
        content = _json(where, zf.read(member))
        if record.startswith(("data/weights/", "data/constants/")):
            _check_payloads(where, zf, member.rsplit("/", 1)[0], content)
        for expr in _values(content, "expr_str"):
            _check_expr(where, expr)


def _check_payloads(where: str, zf: zipfile.ZipFile, folder: str, content: Any) -> None:
    config = content.get("config", {}) if isinstance(content, dict) else {}
    for fqn, meta in (config.items() if isinstance(config, dict) else ()):
        name = meta.get("path_name", "") if isinstance(meta, dict) else ""
        if not isinstance(name, str) or name.startswith(("custom_obj", "opaque_obj")):
            raise UnsupportedModel(f"{where}, which makes '{fqn}' a Python object constant; grokc reads tensors "
                                   "only: export a module whose constants are tensors")
        if meta.get("use_pickle"):
            try:
                data = zf.read(f"{folder}/{name}")
            except KeyError:
                raise UnsupportedModel(f"{where}, which names '{name}' for '{fqn}', a member it lacks; save the "
                                       "program again with torch.export.save") from None
            _check_pickle(f"{where} (for '{fqn}')", data)


def _check_pickle(where: str, data: bytes) -> None:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # any refusal of the safe unpickler means the same  # noqa: BLE001
        raise UnsupportedModel(f"{where}, a pickle that torch.load(weights_only=True) refuses "
                               f"({type(exc).__name__}): loading it could run code; save the program from plain "
                               "tensors with torch.export.save") from None


def _check_expr(where: str, expr: object) -> None:
    if not is_plain(expr):
        raise UnsupportedModel(f"{where}, whose symbolic shape expression '{str(expr)[:80]}' is not arithmetic on "
                               "symbols; save the program again with torch.export.save")


def _json(where: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnsupportedModel(f"{where}, which is not JSON ({exc}); save the program again with "
                               "torch.export.save") from None


def _values(node: Any, key: str) -> Iterator[Any]:
    """Every value of ``key`` in the JSON tree ``node``."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if key in n:
                yield n[key]
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
