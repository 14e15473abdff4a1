"""Graph frontends' shared half: a source graph (``opgraph.OpGraph``) -> ``LoadedModel`` with the IR of
that graph.

1. ``convert.Conversion`` runs the rules (``rules_*.py``, plus a reader's own), pattern + check +
   rewrite, over the graph in topological order, emitting raw IR (``emit.py``);
2. ``canonical.canonicalize`` walks the raw IR as a Llama-family decoder, names it as
   ``compiler/trace.py`` names a traced graph and reads the architecture from it;
3. ``to_loaded`` builds the ``ModelConfig`` (family ``llama``, or ``qwen2`` when the q/k/v
   projections have biases), the module (``{"forward": graph}`` with canonically
   named parameters and the int4 grids the source stored, ``meta.carried``) and the ``LoadedModel``.

The ONNX reader (``frontends/onnx``) and the torch.export reader (``frontends/torch_export``) each
produce an ``OpGraph`` and an evaluator for it; everything else is here.
"""

from __future__ import annotations

from collections.abc import Sequence

from grokc.compiler import models
from grokc.compiler.frontends import LoadedModel, check_weight_shapes
from grokc.compiler.frontends.graph import (
    rules_attention,
    rules_linear,
    rules_mlp,
    rules_norm,
    rules_plumbing,
    rules_rope,
)
from grokc.compiler.frontends.graph.canonical import canonicalize
from grokc.compiler.frontends.graph.convert import Conversion, Rule, find_inputs
from grokc.compiler.frontends.graph.opgraph import OpGraph
from grokc.compiler.frontends.graph.source import SourceInfo
from grokc.core.config import ModelConfig
from grokc.core.errors import UnsupportedModel
from grokc.core.ir import Module, frozen_array
from grokc.core.meta import ModuleMeta

# Rules every source shares, in the order they are tried at a node.
SHARED_RULES: tuple[Rule, ...] = (*rules_plumbing.RULES, *rules_norm.RULES, *rules_linear.RULES, *rules_rope.RULES,
                                  *rules_attention.RULES, *rules_mlp.RULES)
DEFAULT_CONTEXT = 2048   # a graph that says nothing of its context (torch exports), as Hugging Face's default
# The family whose IR the rules emit: Llama's, or Qwen2's (Llama's with q/k/v biases) when the graph has them.
FAMILIES = {False: "llama", True: "qwen2"}


def to_loaded(graph: OpGraph, rules: Sequence[Rule], info: SourceInfo, source_sha256: str, source_format: str,
              progress=None) -> LoadedModel:
    """Convert ``graph`` with ``rules`` into a ``LoadedModel`` carrying its IR."""
    say = progress or (lambda _msg: None)
    say(f"matching {len(graph.nodes)} nodes of {graph.source} against grokc's patterns")
    cv = Conversion(graph, find_inputs(graph))
    cv.run(rules)
    canon = canonicalize(cv.ir, cv.logits(), graph.source)
    for note in cv.notes:
        say(note)
    if info.context is None:
        say(f"{graph.source} holds no context length; assuming {DEFAULT_CONTEXT} (a config.json beside the "
            "tokenizer with max_position_embeddings sets it)")
    try:
        config = ModelConfig(**canon.fields, max_position_embeddings=info.context or DEFAULT_CONTEXT,
                             bos_token_id=info.bos_token_id, eos_token_ids=info.eos_token_ids,
                             architecture=FAMILIES[canon.fields["qkv_bias"]])
    except ValueError as exc:
        raise UnsupportedModel(f"{graph.source} describes an inconsistent model: {exc}") from exc
    arch = models.get(config.architecture)
    order = arch.weight_shapes(config)
    if set(order) != set(canon.weights):
        raise UnsupportedModel(f"{graph.source}: the graph's weights {sorted(set(canon.weights) ^ set(order))} do "
                               f"not fit a {arch.name} model")
    weights = {n: frozen_array(canon.weights[n]) for n in order}
    check_weight_shapes(weights, config, graph.source)
    params = {**weights, **{k: frozen_array(v) for k, v in arch.model.constants(config).items()}}
    module = Module(config, {"forward": canon.graph}, params, meta=ModuleMeta(carried=canon.carried))
    return LoadedModel(config, weights, info.tokenizer_json, info.chat_template, source_sha256, source_format,
                       module=module)
