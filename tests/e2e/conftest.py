"""SmolLM2-135M artifacts built once per session (real GGUF, real nvcc)."""

import pytest

from grokc.compiler.build import BuildOptions, build


@pytest.fixture(scope="session")
def smollm2_artifacts(tmp_path_factory, smollm2_gguf):
    """Factory: ``smollm2_artifacts("fp16")`` -> path of that build (built on first request)."""
    root = tmp_path_factory.mktemp("smollm2")
    built = {}

    def get(quant: str, group_size: int | None = None):
        key = f"{quant}-g{group_size}" if group_size else quant
        if key not in built:
            build(smollm2_gguf, root / key, BuildOptions(quant=quant, group_size=group_size, archs=("sm90",),
                                                         batch=4, buckets=(128, 512), max_seq=1024))
            built[key] = root / key
        return built[key]

    return get
