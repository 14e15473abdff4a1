"""Session fixtures of the family tests: the tiny models of ``tiny_families.py`` on disk, their
transformers references, and their artifacts (built once each).

- ``tiny_family(name)``: the ``TinyFamily`` (HF folder + GGUF), written on first use.
- ``hf_reference(name, source)``: transformers' fp32 model from the folder (``"hf"``) or from the
  GGUF (``"gguf"``, with ``GGUF_OVERRIDES``: what a GGUF does not carry, given as grokc reads it).
- ``family_artifact(name, source, quant="fp16")``: the artifact of that build (sm90, batch 2,
  buckets 16 and 64, max_seq 128). Builds of the same kernels share one nvcc run through the
  kernel cache (``targets/kernel_cache.py``).
"""

from __future__ import annotations

import pytest
from tiny_families import write_family

# What transformers' GGUF loader cannot read from these GGUFs (it falls back to its defaults), given
# as grokc reads them: Qwen3's head_dim (key_length; transformers' mapping lacks it), Gemma 3's query
# scalar (llama.cpp and grokc take key_length), Phi-3's longrope (its factor tensors and keys).
GGUF_OVERRIDES = {
    "qwen3": {"head_dim": 32},
    "gemma3": {"query_pre_attn_scalar": 32},
}
BUILD = dict(archs=("sm90",), batch=2, buckets=(16, 64), max_seq=128, quality_tokens=0)


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = write_family(name, root)
        return made[name]

    return get


def _gguf_overrides(name: str, folder) -> dict:
    if name != "phi3_longrope":
        return GGUF_OVERRIDES.get(name, {})
    import json

    cfg = json.loads((folder / "config.json").read_text())
    return {"rope_scaling": dict(cfg["rope_parameters"]),
            "original_max_position_embeddings": cfg["original_max_position_embeddings"]}


@pytest.fixture(scope="session")
def hf_reference(tiny_family):
    transformers = pytest.importorskip("transformers")
    import torch

    made = {}

    def get(name: str, source: str = "hf"):
        if (name, source) not in made:
            fam = tiny_family(name)
            if source == "hf":
                model = transformers.AutoModelForCausalLM.from_pretrained(fam.hf, dtype=torch.float32)
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    fam.gguf.parent, gguf_file=fam.gguf.name, dtype=torch.float32, **_gguf_overrides(name, fam.hf))
            made[name, source] = model.eval()
        return made[name, source]

    return get


@pytest.fixture(scope="session")
def family_artifact(tmp_path_factory, tiny_family):
    from grokc.compiler.build import BuildOptions, build

    root = tmp_path_factory.mktemp("family-artifacts")
    made = {}

    def get(name: str, source: str = "hf", quant: str = "fp16"):
        key = (name, source, quant)
        if key not in made:
            fam = tiny_family(name)
            out = root / f"{name}-{source}-{quant}"
            build(fam.hf if source == "hf" else fam.gguf, out, BuildOptions(quant=quant, **BUILD))
            made[key] = out
        return made[key]

    return get
