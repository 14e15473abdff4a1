"""What an architecture is to grokc: one small unit of data per model family (llama.cpp's
``src/models/<family>.cpp`` idea).

An ``Architecture`` says how the family is recognised (Hugging Face ``model_type`` and class
names, GGUF ``general.architecture``), which tensors it has (kinds of ``core/tensors.py``, shapes
from the config, optional ones flagged), how its Hugging Face checkpoints name them, which of them
its files store fused (``Split``), what its config keys mean beyond the shared Llama-like ones
(``hf_config`` / ``gguf_config``), what llama.cpp's converter did to its tensors, and the torch
model that ``compiler/trace.py`` exports. The frontends, the tracer and the passes ask the
architecture; nothing else tests a family's name.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grokc.compiler.models.transformer import TENSORS, TensorSpec, Transformer
from grokc.core.config import ModelConfig
from grokc.core.tensors import LLAMA_HF, Tensor, name

ConfigHook = Callable[..., dict[str, Any]]
__all__ = ["Architecture", "SentencePiece", "Split", "TensorSpec"]


class SentencePiece(enum.Enum):
    """How a family's GGUF SentencePiece vocabulary (``tokenizer.ggml.model`` llama) becomes a
    tokenizer, as transformers builds it for the architecture (``frontends/gguf_tokenizer.py``)."""

    LLAMA = "llama"   # Metaspace pre-tokenizer prepending "▁" to the text (Llama 2, Mistral v0.x)
    GEMMA = "gemma"   # spaces -> "▁" with no prefix; merges in file order; space-run tokens respelled
    PHI3 = "phi3"     # a normalizer prepending "▁" and turning spaces into "▁"


@dataclass(frozen=True)
class Split:
    """A per-layer tensor the family's files store as the rows of several kinds, one after the other
    (Phi-3's ``qkv_proj``: q, k, v); the frontends split it into the parts' canonical weights."""

    gguf: str                   # its GGUF base name: blk.<i>.<gguf>.weight
    hf: str                     # its Hugging Face name template ({i}: the layer)
    parts: tuple[Tensor, ...]


@dataclass(frozen=True)
class Architecture:
    name: str                                   # ModelConfig.architecture and the manifest's name
    hf_model_types: tuple[str, ...]             # config.json "model_type" values it reads
    hf_classes: tuple[str, ...]                 # config.json "architectures" entries it accepts
    gguf_arch: str | None                       # GGUF general.architecture, None: no GGUF form
    tensors: tuple[TensorSpec, ...] = TENSORS   # the shared block's, present by the config's variants
    model: Callable[[ModelConfig], Any] = Transformer   # the torch nn.Module compiler/trace.py exports
    hf_names: Mapping[Tensor, str] = field(default_factory=lambda: LLAMA_HF)
    splits: tuple[Split, ...] = ()              # tensors its files store fused
    # config.json dict, its place for messages -> ModelConfig fields beyond (or instead of) the shared
    # ones; raises UnsupportedModel for settings the family's graph lacks
    hf_config: ConfigHook = lambda raw, where: {}
    # key(name, default) over the GGUF metadata, tensor(kind) -> f32 array or None (the kinds of
    # config_tensors), the file's name -> the same
    gguf_config: ConfigHook = lambda key, tensor, where: {}
    config_tensors: tuple[Tensor, ...] = ()     # GGUF tensors that hold config (rope factors), not weights
    gguf_permutes_qk: bool = False              # convert_hf_to_gguf.py interleaved q/k rows (unpermute_qk)
    gguf_moe: bool = False                      # its GGUF form is gguf_arch with <arch>.expert_count > 0 (Mixtral)
    hf_weights: bool = True                     # False: config.json only (--synthetic-weights; Grok-1)
    gguf_sentencepiece: SentencePiece = SentencePiece.LLAMA
    hf_norm_shift: float = 0.0                  # HF norm weights are w where the model scales by w + shift;
                                                # the canonical (GGUF) ones hold w + shift (Gemma: 1)

    def weight_shapes(self, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Every weight a model of ``cfg`` has, canonical name -> shape (``[out, in]`` for linears),
        in a fixed order."""
        out: dict[str, tuple[int, ...]] = {}
        for spec in self.tensors:
            if not spec.present(cfg):
                continue
            layers = range(cfg.num_layers) if spec.kind.per_layer else (None,)
            for i in layers:
                out[name(spec.kind, i, spec.suffix)] = spec.shape(cfg)
        return out

    def hf_to_canonical(self, cfg: ModelConfig) -> dict[str, str]:
        """Hugging Face name -> canonical name for every weight of ``weight_shapes(cfg)`` its
        checkpoints store as it is (not the parts of a ``Split``, nor one tensor per expert: ``hf_stacked``)."""
        fused = {kind for s in self.splits for kind in s.parts}
        out = {}
        for spec in self.tensors:
            if not spec.present(cfg) or spec.kind in fused or "{e}" in self.hf_names[spec.kind]:
                continue
            for i in range(cfg.num_layers) if spec.kind.per_layer else (None,):
                out[f"{self.hf_names[spec.kind].format(i=i)}.{spec.suffix}"] = name(spec.kind, i, spec.suffix)
        return out

    def hf_stacked(self, cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
        """Canonical name of each expert-stacked weight whose Hugging Face checkpoints hold one tensor
        per expert (a name template with ``{e}``) -> those tensors' names, expert 0 first."""
        out = {}
        for spec in self.tensors:
            template = self.hf_names.get(spec.kind, "")
            if spec.present(cfg) and "{e}" in template:
                for i in range(cfg.num_layers):
                    out[name(spec.kind, i, spec.suffix)] = tuple(
                        f"{template.format(i=i, e=e)}.{spec.suffix}" for e in range(cfg.moe.n_experts))
        return out

    def split_sources(self, cfg: ModelConfig, hf: bool) -> dict[str, tuple[str, ...]]:
        """Name of each fused tensor in the files (Hugging Face or GGUF) -> the canonical weights
        its rows hold, in order."""
        return {(f"{s.hf.format(i=i)}.weight" if hf else f"blk.{i}.{s.gguf}.weight"):
                tuple(name(kind, i) for kind in s.parts)
                for s in self.splits for i in range(cfg.num_layers)}

    def split_rows(self, fused: np.ndarray, parts: tuple[str, ...], cfg: ModelConfig) -> dict[str, np.ndarray] | None:
        """``fused``'s rows as the ``parts`` weights (canonical names), or None when its shape is not
        theirs stacked."""
        shapes = self.weight_shapes(cfg)
        rows = [shapes[p][0] for p in parts]
        if fused.shape != (sum(rows), *shapes[parts[0]][1:]):
            return None
        return dict(zip(parts, np.split(fused, np.cumsum(rows)[:-1])))
