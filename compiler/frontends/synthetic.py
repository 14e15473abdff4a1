"""A model config without weights -> a LoadedModel whose weights will be synthetic.

``grokc build CONFIG --synthetic-weights`` takes a Hugging Face ``config.json`` (or a folder that
holds one, plus an optional ``tokenizer.json``). The weights handed to the compiler are zero-stride
zero arrays of the right shapes (no memory); the build replaces every weight-derived parameter
with a seeded ``SyntheticTensor`` spec that the runner fills on the device.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from grokc.compiler.frontends import LoadedModel, weight_shapes
from grokc.compiler.frontends.hf import config_from_hf
from grokc.core.errors import UnsupportedModel


def load_config(path: str | Path, seed: int) -> LoadedModel:
    path = Path(path)
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        raise UnsupportedModel(f"'{path}' is neither a config.json nor a folder holding one; "
                               "--synthetic-weights needs a Hugging Face model config")
    try:
        raw = json.loads(config_file.read_text())
    except ValueError as e:
        raise UnsupportedModel(f"'{config_file}' is not valid JSON ({e}); pass a Hugging Face config.json") from None
    config = config_from_hf(raw, config_file.parent)
    tokenizer = config_file.parent / "tokenizer.json"
    zero = np.zeros((), np.float32)
    return LoadedModel(
        config=config,
        weights={name: np.broadcast_to(zero, shape) for name, shape in weight_shapes(config).items()},
        tokenizer_json=tokenizer.read_text() if tokenizer.is_file() else placeholder_tokenizer(config.vocab_size),
        chat_template=None,
        source_sha256=hashlib.sha256(config_file.read_bytes()).hexdigest(),
        source_format="config",
        synthetic_seed=seed,
    )


def placeholder_tokenizer(vocab_size: int) -> str:
    """A word-level tokenizer whose tokens are ``<0>`` .. ``<V-1>``, for configs without one."""
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": {"type": "Fuse"}, "model": {"type": "WordLevel", "unk_token": "<0>",
                                                "vocab": {f"<{i}>": i for i in range(vocab_size)}},
    }, sort_keys=True)
