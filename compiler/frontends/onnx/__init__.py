"""ONNX frontend: an ``.onnx`` file (with its external data) -> ``LoadedModel`` carrying the IR of its graph.

Accepted: the graphs ``torch.onnx.export`` writes of a Hugging Face Llama or Qwen2 (opset 20 decomposed
or opset 23 with RMSNormalization, RotaryEmbedding and Attention; with or without
``past_key_values`` inputs and ``present`` outputs), and those onnxruntime-genai's model builder
writes (GroupQueryAttention with rotary folded in, SimplifiedLayerNormalization and
SkipSimplifiedLayerNormalization, MatMulNBits int4 weights, GatherBlockQuantized embeddings).
``reader.py`` reads the file into an ``OpGraph``; the shared rules (``frontends/graph``) plus the
contrib-op rules (``contrib.py``) turn it into IR. Any node no rule covers is refused naming it.
``source_sha256`` covers the graph, its external-data files, the tokenizer and the metadata read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from grokc.compiler.frontends import LoadedModel
from grokc.compiler.frontends.graph import SHARED_RULES, to_loaded
from grokc.compiler.frontends.graph.source import read_source_info, sources_sha256
from grokc.compiler.frontends.onnx import contrib
from grokc.compiler.frontends.onnx.reader import read_model, to_opgraph

RULES = (*SHARED_RULES, *contrib.RULES)


def load_onnx(path: Path, tokenizer: str | Path | None = None,
              progress: Callable[[str], None] | None = None) -> LoadedModel:
    say = progress or (lambda _msg: None)
    say(f"reading ONNX model {path.name}")
    model, data_files = read_model(path)
    graph = to_opgraph(model, path)
    info = read_source_info(path, tokenizer)
    say(f"hashing {path.name}")
    digest = sources_sha256([path, *data_files, *info.files])
    return to_loaded(graph, RULES, info, digest, "onnx", say)
