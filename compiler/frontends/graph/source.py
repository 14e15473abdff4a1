"""What a graph file does not hold: its tokenizer, special tokens and context length.

``--tokenizer`` names a ``tokenizer.json`` or a folder holding one; without it, the
``tokenizer.json`` beside the model file is used (onnxruntime-genai's model builder writes one
there). The folder of the tokenizer, and the model's own folder, may also hold what
``transformers`` and the model builder write beside a model: ``config.json`` and
``generation_config.json`` (``bos_token_id``, ``eos_token_id``, ``max_position_embeddings``),
``genai_config.json`` (``model.bos_token_id``, ``model.eos_token_id``, ``model.context_length``)
and ``tokenizer_config.json`` or ``chat_template.jinja`` (the chat template). Nothing of the
architecture is read from them: that comes from the graph.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from grokc.compiler.frontends import file_sha256
from grokc.compiler.frontends.hf import _chat_template, _ids, _read_json
from grokc.core.errors import UnsupportedModel


@dataclass(frozen=True)
class SourceInfo:
    tokenizer_json: str
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    context: int | None                 # max_position_embeddings, when a config beside says
    files: tuple[Path, ...]             # the files read, for the source hash


def read_source_info(model: Path, tokenizer: str | Path | None) -> SourceInfo:
    """The tokenizer and metadata of the graph file ``model`` (see the module doc)."""
    if tokenizer is None:
        path = model.parent / "tokenizer.json"
        if not path.is_file():
            raise UnsupportedModel(f"'{model}' has no tokenizer.json beside it; pass --tokenizer with a "
                                   "tokenizer.json or the Hugging Face folder of the model")
    else:
        tokenizer = Path(tokenizer)
        path = tokenizer / "tokenizer.json" if tokenizer.is_dir() else tokenizer
        if not path.is_file():
            raise UnsupportedModel(f"--tokenizer '{tokenizer}' is not a tokenizer.json or a folder holding one")
    folders = list(dict.fromkeys([path.parent, model.parent]))
    files = [path]
    config, generation, genai = {}, {}, {}
    for folder in reversed(folders):   # the tokenizer's folder wins
        for name, into in (("config.json", config), ("generation_config.json", generation),
                           ("genai_config.json", genai)):
            if (folder / name).is_file():
                into.update(_read_json(folder / name))
                files.append(folder / name)
    model_cfg = genai.get("model", {}) if isinstance(genai.get("model"), dict) else {}
    eos = _ids(config.get("eos_token_id")) + _ids(generation.get("eos_token_id")) + _ids(model_cfg.get("eos_token_id"))
    bos = config.get("bos_token_id", model_cfg.get("bos_token_id"))
    context = config.get("max_position_embeddings", model_cfg.get("context_length"))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UnsupportedModel(f"cannot read tokenizer '{path}' ({exc}); pass a tokenizer.json") from exc
    return SourceInfo(text, _chat_template(path.parent), None if bos is None else int(bos),
                      tuple(dict.fromkeys(eos)), None if context is None else int(context),
                      tuple(dict.fromkeys(files)))


def sources_sha256(files: list[Path]) -> str:
    """SHA-256 over ``"<sha256 of file>  <file name>\\n"`` lines, sorted by name, of every file a
    graph model was read from (the graph, its external data, the tokenizer and metadata)."""
    lines = sorted(f"{file_sha256(p)}  {p.name}\n" for p in dict.fromkeys(files))
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()
