"""What an architecture is to grokc: one small unit of data per model family (llama.cpp's
``src/models/<family>.cpp`` idea).

An ``Architecture`` says how the family is recognised (Hugging Face ``model_type`` and class
names, GGUF ``general.architecture``), which tensors it has (kinds of ``core/tensors.py``, shapes
from the config, optional ones flagged), how its Hugging Face checkpoints name them, what its
config keys mean beyond the shared Llama-like ones (``hf_config`` / ``gguf_config``), what
llama.cpp's converter did to its tensors, and the torch model that ``compiler/trace.py`` exports.
The frontends, the tracer and the passes ask the architecture; nothing else tests a family's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grokc.core.config import ModelConfig
from grokc.core.tensors import LLAMA_HF, Tensor, name

ConfigHook = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class TensorSpec:
    kind: Tensor
    shape: Callable[[ModelConfig], tuple[int, ...]]
    present: Callable[[ModelConfig], bool] = lambda cfg: True   # e.g. the LM head only when untied
    suffix: str = "weight"                                      # "bias" for biases


@dataclass(frozen=True)
class Architecture:
    name: str                                   # ModelConfig.architecture and the manifest's name
    hf_model_types: tuple[str, ...]             # config.json "model_type" values it reads
    hf_classes: tuple[str, ...]                 # config.json "architectures" entries it accepts
    gguf_arch: str | None                       # GGUF general.architecture, None: no GGUF form
    tensors: tuple[TensorSpec, ...]
    model: Callable[[ModelConfig], Any]         # the torch nn.Module compiler/trace.py exports
    hf_names: Mapping[Tensor, str] = field(default_factory=lambda: LLAMA_HF)
    # config.json dict, its place for messages -> ModelConfig fields beyond the shared ones; raises
    # UnsupportedModel for settings the family's graph lacks
    hf_config: ConfigHook = lambda raw, where: {}
    # key(name, default) over the GGUF metadata, the file's name -> the same
    gguf_config: ConfigHook = lambda key, where: {}
    gguf_permutes_qk: bool = False              # convert_hf_to_gguf.py interleaved q/k rows (unpermute_qk)
    gguf_moe: bool = False                      # its GGUF form is gguf_arch with <arch>.expert_count > 0 (Mixtral)

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
        """Hugging Face name -> canonical name for every weight of ``weight_shapes(cfg)`` that the
        checkpoints store whole (not one tensor per expert: ``hf_stacked``)."""
        out = {}
        for spec in self.tensors:
            if not spec.present(cfg) or "{e}" in self.hf_names[spec.kind]:
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
