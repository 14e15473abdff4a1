"""torch.export frontend: a ``.pt2`` program, or an ``nn.Module`` with example inputs -> ``LoadedModel``
carrying the IR of its ATen graph.

- ``load_pt2(path, tokenizer)``: a program saved with ``torch.export.save`` (``grokc build model.pt2``),
  screened by ``archive.check_archive`` first (nothing in it may run code when torch loads it);
- ``load_module(module, example_inputs, tokenizer)``: the Python API; exports ``module`` with
  ``torch.export.export(strict=False)``, the sequence dimension (dim 1 of every 2-D integer input,
  e.g. ``input_ids`` and ``position_ids``) dynamic unless ``dynamic_shapes`` says otherwise; a
  module whose ``forward`` takes ``use_cache`` (transformers) gets ``use_cache=False`` unless the
  inputs set it, so its outputs hold no cache object.

Either way ``reader.py`` translates the ATen graph into the shared vocabulary and the shared rules
(``frontends/graph``) turn it into IR: a transformers ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``
or a user's own Llama-like module, as long as its graph computes a Llama-family decoder (RMSNorm,
rotate-half rotary embeddings of the positions, causal grouped-query attention, SwiGLU MLP, biases
on q, k and v or none).
"""

from __future__ import annotations

import hashlib
import inspect
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from grokc.compiler.frontends import LoadedModel
from grokc.compiler.frontends.graph import SHARED_RULES, to_loaded
from grokc.compiler.frontends.graph.source import SourceInfo, read_source_info, sources_sha256
from grokc.compiler.frontends.torch_export.archive import check_archive
from grokc.compiler.frontends.torch_export.reader import to_opgraph
from grokc.core.errors import UnsupportedModel

Progress = Callable[[str], None]


def load_pt2(path: Path, tokenizer: str | Path | None = None, progress: Progress | None = None) -> LoadedModel:
    say = progress or (lambda _msg: None)
    say(f"reading torch.export program {path.name}")
    check_archive(path)
    try:
        ep = torch.export.load(str(path))
    except (zipfile.BadZipFile, RuntimeError, KeyError, ValueError, EOFError, OSError) as exc:
        raise UnsupportedModel(f"cannot read '{path}' as a torch.export program ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}); save it with torch.export.save") from exc
    info = read_source_info(path, tokenizer)
    return _load(ep, str(path), info, sources_sha256([path, *info.files]), "pt2", say)


def load_module(module: torch.nn.Module, example_inputs: tuple | Mapping[str, Any], tokenizer: str | Path,
                dynamic_shapes: Any = None, progress: Progress | None = None) -> LoadedModel:
    """Export ``module`` on ``example_inputs`` (positional arguments, or keyword arguments by name) and
    load its graph; build it with ``compiler.build.build_loaded``. The source hash covers the
    parameters and the tokenizer files."""
    say = progress or (lambda _msg: None)
    by_name = isinstance(example_inputs, Mapping)
    if by_name and "use_cache" in inspect.signature(module.forward).parameters:
        example_inputs = {"use_cache": False, **example_inputs}   # transformers: no cache object in the outputs
    if dynamic_shapes is None:
        seq = torch.export.Dim("seq", min=2, max=1 << 16)
        mark = lambda t: {1: seq} if isinstance(t, torch.Tensor) and t.ndim == 2 and not t.is_floating_point() else None  # noqa: E731
        dynamic_shapes = {k: mark(v) for k, v in example_inputs.items()} if by_name else tuple(
            mark(a) for a in example_inputs)
    say(f"exporting {type(module).__name__} with torch.export")
    was_training = module.training
    module.eval()
    try:
        ep = torch.export.export(module, () if by_name else tuple(example_inputs),
                                 dict(example_inputs) if by_name else None, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # torch.export raises many kinds; the user gets its first line  # noqa: BLE001
        raise UnsupportedModel(f"torch.export could not export {type(module).__name__} ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}); pass dynamic_shapes or other example "
                               "inputs") from exc
    finally:
        module.train(was_training)
    tok = Path(tokenizer)
    info = read_source_info(tok / "tokenizer.json" if tok.is_dir() else tok, tokenizer)
    return _load(ep, type(module).__name__, info, _state_sha256(ep, info), "pt2", say)


def _load(ep: torch.export.ExportedProgram, source: str, info: SourceInfo, digest: str, fmt: str,
          say: Progress) -> LoadedModel:
    return to_loaded(to_opgraph(ep, source), SHARED_RULES, info, digest, fmt, say)


def _state_sha256(ep: torch.export.ExportedProgram, info: SourceInfo) -> str:
    h = hashlib.sha256()
    for name in sorted(ep.state_dict):
        t = ep.state_dict[name].detach().contiguous()
        h.update(name.encode())
        h.update(t.float().numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    h.update(sources_sha256(list(info.files)).encode())
    return h.hexdigest()
