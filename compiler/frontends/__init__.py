"""Model-loading frontends: a model file on disk -> ``LoadedModel`` (config, fp32 weights, tokenizer).

Four sources are understood, told apart by what the path *is*, never by its name:

- a GGUF file (starts with the magic ``GGUF``): ``frontends.gguf``, every tensor dequantized to fp32
  and re-laid-out as Hugging Face checkpoints lay it out (llama.cpp's q/k row order undone);
- a Hugging Face folder (holds ``config.json``, ``*.safetensors`` and ``tokenizer.json``):
  ``frontends.hf``;
- a ``torch.export.save`` archive (a zip file): ``frontends.torch_export``;
- anything else is read as an ONNX model (a protobuf, with its external-data files beside it):
  ``frontends.onnx``.

The last two are graph frontends: they turn the user's graph itself into grokc's IR
(``frontends.graph``) and hand it over as ``LoadedModel.module``, which the build compiles instead
of tracing grokc's own torch model; they need a tokenizer from elsewhere (``tokenizer``).

The model file names its architecture (``compiler/models``), which says what the weights are.
Whatever the source, they come out under the canonical names of ``weight_shapes(config)``
(``core/tensors.py``), shaped ``[out, in]`` as in ``torch.nn.Linear``, float32, C-contiguous and
read-only; ``output.weight`` is present only when the model does not tie it to the embeddings.
Anything that is not a supported model is refused with one ``UnsupportedModel`` line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grokc.compiler import models
from grokc.core.config import ModelConfig
from grokc.core.errors import UnsupportedModel
from grokc.core.ir import Module

GGUF_MAGIC = b"GGUF"
ZIP_MAGIC = b"PK\x03\x04"   # torch.export.save writes a zip archive
ONNX_FIRST_BYTE = b"\x08"   # an ONNX ModelProto begins with its field 1, ir_version (a varint)


@dataclass(frozen=True)
class LoadedModel:
    """A model as every frontend hands it to the compiler.

    ``weights`` maps the canonical names of ``weight_shapes(config)`` (``core/tensors.py``) to
    float32, C-contiguous, read-only arrays, ``[out, in]`` for linears. ``source_sha256``
    identifies the bytes the model came from (see each frontend for what exactly is hashed);
    ``source_format`` is ``"gguf"``, ``"hf"``, ``"onnx"``, ``"pt2"`` or ``"config"``. ``module``, set by
    the graph frontends, is the model's ``{"forward": graph}`` IR built from its own graph, with
    canonically named parameters (``weights`` as its f32 ones) and ``meta.carried``; None: the build
    traces the architecture's torch model.
    """

    config: ModelConfig
    weights: Mapping[str, np.ndarray]
    tokenizer_json: str
    chat_template: str | None
    source_sha256: str
    source_format: str  # "gguf" | "hf" | "onnx" | "pt2" | "config" (synthetic weights)
    synthetic_seed: int | None = None  # set: the weights are placeholders for seeded synthetic ones
    module: Module | None = None       # set by graph frontends: the IR of the source's own graph


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a model of this config has (canonical names, its architecture's order) and its shape."""
    return models.get(config.architecture).weight_shapes(config)


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


def check_finite(weights: Mapping[str, np.ndarray], source: str) -> None:
    """Raise ``UnsupportedModel`` naming the first floating-point weight that holds a NaN or an infinity."""
    for name, w in weights.items():
        if np.issubdtype(w.dtype, np.floating) and not np.isfinite(w).all():
            bad = int(w.size - np.count_nonzero(np.isfinite(w)))
            raise UnsupportedModel(f"weight {name!r} of {source} holds {bad} NaN or infinite values; the "
                                   "checkpoint is corrupt or overflows, so re-export or rescale the model")


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


def load_model(path: str | Path, progress: Callable[[str], None] | None = None,
               tokenizer: str | Path | None = None) -> LoadedModel:
    """Load a model of a supported architecture from a GGUF file, a Hugging Face folder, an ONNX
    model or a ``torch.export`` archive.

    Parameters
    ----------
    path
        A GGUF file, a folder holding ``config.json``, ``*.safetensors`` and ``tokenizer.json``, an
        ONNX file (external-data files beside it) or a ``.pt2`` file of ``torch.export.save``.
    progress
        Called with a short line before each long step (reading, dequantizing, hashing), if given.
    tokenizer
        ONNX and ``.pt2`` only: a ``tokenizer.json`` or a Hugging Face folder holding one (default:
        the ``tokenizer.json`` beside the model file).

    Returns
    -------
    LoadedModel
        Config, fp32 weights under canonical names, tokenizer.json text, chat template, the source
        hash, and for graph sources the IR of their graph.

    Raises
    ------
    UnsupportedModel
        The path is missing, is none of the above, is truncated or corrupt, or holds a model of an
        architecture (or, for a graph, a node) grokc does not compile.
    """
    path = Path(path)
    expected = "a .gguf file, a Hugging Face folder with config.json, an .onnx file or a torch.export .pt2 file"
    if not path.exists():
        raise UnsupportedModel(f"model path '{path}' does not exist; pass {expected}")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UnsupportedModel(f"folder '{path}' has no config.json; pass {expected}")
        _no_tokenizer_option(tokenizer, path)
        from grokc.compiler.frontends.hf import load_hf

        return load_hf(path, progress)
    try:
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise UnsupportedModel(f"cannot read model file '{path}' ({exc.strerror}); pass {expected}") from exc
    if head == GGUF_MAGIC:
        _no_tokenizer_option(tokenizer, path)
        from grokc.compiler.frontends.gguf import load_gguf

        return load_gguf(path, progress)
    if head == ZIP_MAGIC:
        from grokc.compiler.frontends.torch_export import load_pt2

        return load_pt2(path, tokenizer, progress)
    if head[:1] == ONNX_FIRST_BYTE:
        from grokc.compiler.frontends.onnx import load_onnx

        return load_onnx(path, tokenizer, progress)
    raise UnsupportedModel(
        f"'{path}' is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}), a torch.export archive "
        f"or an ONNX model; pass {expected}"
    )


def _no_tokenizer_option(tokenizer: str | Path | None, path: Path) -> None:
    if tokenizer is not None:
        raise UnsupportedModel(f"--tokenizer is for ONNX and torch.export models; '{path}' carries its own "
                               "tokenizer, so drop --tokenizer")
