"""Fixtures writing tiny model files for the frontend tests (see ``frontends_tiny``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from frontends_tiny import write_tiny_gguf, write_tiny_hf


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Callable[..., Path]:
    """``tiny_gguf(name="m.gguf", **write_tiny_gguf options)`` -> path of a fresh tiny GGUF."""
    return lambda name="tiny.gguf", **kw: write_tiny_gguf(tmp_path / name, **kw)


@pytest.fixture
def tiny_hf(tmp_path: Path) -> Callable[..., Path]:
    """``tiny_hf(name="hf", **write_tiny_hf options)`` -> a fresh tiny Hugging Face folder."""
    return lambda name="hf", **kw: write_tiny_hf(tmp_path / name, **kw)
