"""Model-loading frontends: a model file on disk -> ``LoadedModel`` (config, fp32 weights, tokenizer).

Two sources are understood, told apart by what the path *is*, never by its name:

- a GGUF file (starts with the magic ``GGUF``): ``frontends.gguf``, every tensor dequantized to fp32
  and renamed and re-laid-out to Hugging Face Llama conventions;
- a Hugging Face folder (holds ``config.json``, ``*.safetensors`` and ``tokenizer.json``):
  ``frontends.hf``.

Whatever the source, the weights come out under the Hugging Face Llama names listed by
``weight_names(config)``, shaped ``[out, in]`` as in ``torch.nn.Linear``, float32, C-contiguous and
read-only. ``lm_head.weight`` is present only when the model does not tie it to the embeddings.
Anything that is not a supported Llama-family model is refused with one ``UnsupportedModel`` line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grokc.core.config import ModelConfig
from grokc.core.errors import UnsupportedModel

GGUF_MAGIC = b"GGUF"

# Per-layer weights, Hugging Face Llama names relative to ``model.layers.{i}.``.
LAYER_WEIGHTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)


@dataclass(frozen=True)
class LoadedModel:
    """A model as every frontend hands it to the compiler.

    ``weights`` maps the names of ``weight_names(config)`` to float32, C-contiguous, read-only
    arrays. ``source_sha256`` identifies the bytes the model came from (see each frontend for what
    exactly is hashed); ``source_format`` is ``"gguf"`` or ``"hf"``.
    """

    config: ModelConfig
    weights: Mapping[str, np.ndarray]
    tokenizer_json: str
    chat_template: str | None
    source_sha256: str
    source_format: str  # "gguf" | "hf" | "config" (synthetic weights)
    synthetic_seed: int | None = None  # set: the weights are placeholders for seeded synthetic ones


def weight_names(config: ModelConfig) -> list[str]:
    """Every weight a Llama-family model of this config has, in a fixed order (HF names)."""
    names = ["model.embed_tokens.weight"]
    for i in range(config.num_layers):
        names += [f"model.layers.{i}.{w}.weight" for w in LAYER_WEIGHTS]
    names.append("model.norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape each of ``weight_names(config)`` must have: ``[out, in]`` for linears."""
    c = config
    per_layer = {
        "self_attn.q_proj": (c.q_dim, c.hidden_size),
        "self_attn.k_proj": (c.kv_dim, c.hidden_size),
        "self_attn.v_proj": (c.kv_dim, c.hidden_size),
        "self_attn.o_proj": (c.hidden_size, c.q_dim),
        "mlp.gate_proj": (c.intermediate_size, c.hidden_size),
        "mlp.up_proj": (c.intermediate_size, c.hidden_size),
        "mlp.down_proj": (c.hidden_size, c.intermediate_size),
        "input_layernorm": (c.hidden_size,),
        "post_attention_layernorm": (c.hidden_size,),
    }
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        shapes.update({f"model.layers.{i}.{w}.weight": s for w, s in per_layer.items()})
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def check_weight_shapes(weights: Mapping[str, np.ndarray], config: ModelConfig, source: str) -> None:
    """Raise ``UnsupportedModel`` unless ``weights`` has exactly the expected names and shapes.

    ``source`` names where the weights came from, for the message. Names are checked by the
    frontend before this (it knows the file's own names); this is the shared last check.
    """
    for name, shape in weight_shapes(config).items():
        got = tuple(weights[name].shape)
        if got != shape:
            raise UnsupportedModel(
                f"weight {name!r} in {source} has shape {list(got)} but the model config implies "
                f"{list(shape)}; the file's metadata and tensors disagree, so re-export the model"
            )


def frozen_fp32(array: np.ndarray) -> np.ndarray:
    """``array`` as an owned float32, C-contiguous, read-only array (copies unless already one)."""
    out = np.array(array, dtype=np.float32, order="C", copy=True)
    out.flags.writeable = False
    return out


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes (as ``sha256sum`` prints it), streamed in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def load_model(path: str | Path, progress: Callable[[str], None] | None = None) -> LoadedModel:
    """Load a Llama-family model from a GGUF file or a Hugging Face folder.

    Parameters
    ----------
    path
        A GGUF file, or a folder holding ``config.json``, ``*.safetensors`` and ``tokenizer.json``.
    progress
        Called with a short line before each long step (reading, dequantizing, hashing), if given.

    Returns
    -------
    LoadedModel
        Config, fp32 weights under Hugging Face names, tokenizer.json text, chat template, and the
        source hash.

    Raises
    ------
    UnsupportedModel
        The path is missing, is neither a GGUF file nor a Hugging Face folder, is truncated or
        corrupt, or holds a model outside the supported Llama family.
    """
    path = Path(path)
    expected = "a .gguf file or a Hugging Face folder with config.json"
    if not path.exists():
        raise UnsupportedModel(f"model path '{path}' does not exist; pass {expected}")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UnsupportedModel(f"folder '{path}' has no config.json; pass {expected}")
        from grokc.compiler.frontends.hf import load_hf

        return load_hf(path, progress)
    try:
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise UnsupportedModel(f"cannot read model file '{path}' ({exc.strerror}); pass {expected}") from exc
    if head != GGUF_MAGIC:
        raise UnsupportedModel(
            f"'{path}' is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}); pass {expected}"
        )
    from grokc.compiler.frontends.gguf import load_gguf

    return load_gguf(path, progress)
