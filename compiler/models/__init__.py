"""The architectures grokc compiles, one file per family, and how a model file finds its own.

Each family module defines ``ARCH`` (``architecture.Architecture``) and its torch model. Adding a
family is its file, its entry in ``ARCHITECTURES`` and its tests.
"""

from __future__ import annotations

from grokc.compiler.models import gemma3, grok1, llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe
from grokc.compiler.models.architecture import Architecture
from grokc.core.errors import UnsupportedModel

ARCHITECTURES: dict[str, Architecture] = {m.ARCH.name: m.ARCH for m in (llama, mistral, qwen2, qwen3, gemma3, phi3,
                                                                         mixtral, qwen2_moe, qwen3_moe, grok1)}


def supported() -> str:
    """The supported families, for messages: ``llama (HF: llama, mistral; GGUF: llama)``."""
    return "; ".join(f"{a.name} (Hugging Face model_type {', '.join(a.hf_model_types)}"
                     + (f"; GGUF {a.gguf_arch}{' with experts' if a.gguf_moe else ''})" if a.gguf_arch else ")") for a in ARCHITECTURES.values())


def get(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise UnsupportedModel(f"architecture '{name}' is not supported; supported: {supported()}")
    return ARCHITECTURES[name]


def for_hf(model_type: object, where: str) -> Architecture:
    """The architecture of a config.json's ``model_type``, or one ``UnsupportedModel`` line naming it."""
    for arch in ARCHITECTURES.values():
        if model_type in arch.hf_model_types:
            return arch
    raise UnsupportedModel(f"{where} declares model_type {model_type!r}, which grokc does not compile; "
                           f"supported: {supported()}")


def for_gguf(gguf_arch: object, where: str, moe: bool = False) -> Architecture:
    """The architecture of a GGUF ``general.architecture`` (``moe``: the file sets ``<arch>.expert_count``),
    or one ``UnsupportedModel`` line naming it."""
    for arch in ARCHITECTURES.values():
        if arch.gguf_arch is not None and arch.gguf_arch == gguf_arch and arch.gguf_moe == moe:
            return arch
    if moe and any(a.gguf_arch == gguf_arch for a in ARCHITECTURES.values()):
        raise UnsupportedModel(f"{where} is a mixture-of-experts {gguf_arch!r} model ({gguf_arch}.expert_count > 0), "
                               f"which grokc does not compile; supported: {supported()}")
    raise UnsupportedModel(f"{where} has general.architecture {gguf_arch!r}, which grokc does not compile; "
                           f"supported: {supported()}")
