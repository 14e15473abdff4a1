"""Tiny artifacts built once per session for the compiler tests (random weights, real nvcc)."""

import pytest
from tiny_llama import tiny_loaded

from grokc.compiler.build import BuildOptions, build_loaded

TINY_OPTS = dict(archs=("sm90",), batch=3, buckets=(16, 64), max_seq=128)


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_loaded(seed=0)


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory, tiny_model):
    """Paths of the tiny model built with --quant fp16, int4 (per channel), int4 group 32 asymmetric, and
    int4 with a 3% fp16 residual and an int4 LM head (int4-r)."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for name, quant, gs, extra in (("fp16", "fp16", None, {}), ("int4", "int4", None, {}), ("int4-g32", "int4", 32, {}),
                                   ("int4-r", "int4", None, {"fp16_residual": 0.03, "lm_head": "int4"})):
        out[name] = root / name
        build_loaded(tiny_model, out[name], BuildOptions(quant=quant, group_size=gs, **extra, **TINY_OPTS))
    return out
