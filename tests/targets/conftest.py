"""``nvcc``: the path of nvcc (``targets.nvcc.find_nvcc``); a test that asks for it is skipped where
there is none."""

import pytest

from grokc.core.errors import TargetError
from grokc.targets import nvcc as nvcc_step


@pytest.fixture
def nvcc() -> str:
    try:
        return nvcc_step.find_nvcc()
    except TargetError as exc:
        pytest.skip(str(exc))
