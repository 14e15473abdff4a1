"""A small SentencePiece vocabulary shaped like the families' own (Gemma 3's, Phi-3's, Llama 2's),
written as the tokenizer metadata of a GGUF: special tokens first (Gemma: ``<pad> <eos> <bos> <unk>
<mask>``, else ``<unk> <s> </s>``), the 256 ``<0xNN>`` byte tokens, then the pieces of a BPE trained
here with a "▁" space, best first, scored ``-rank`` (no merges: readers derive them), and a few
user-defined tokens: newline runs and, as Gemma files hold them, runs of real spaces; Gemma also
gets ``<start_of_turn>`` / ``<end_of_turn>`` as control tokens."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from tiny_families import CORPUS
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

CONTROL, BYTE, NORMAL, USER_DEFINED = 3, 6, 1, 4


def pieces(size: int = 400) -> list[str]:
    """BPE pieces over "▁"-joined words, in the order they were learned."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False)
    tok.train_from_iterator(CORPUS * 3, trainer)
    vocab = tok.get_vocab()
    return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def write_spm_gguf(path: Path, arch: str) -> Path:
    """A GGUF holding only ``arch``'s tokenizer metadata and a token embedding (for readers that
    look at the tensors)."""
    gemma = arch.startswith("gemma")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] if gemma else ["<unk>", "<s>", "</s>"]
    tokens, types = list(specials), [CONTROL] * len(specials)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    learned = [p for p in pieces() if p not in tokens]
    tokens += learned
    types += [NORMAL] * len(learned)
    extra = ["\n", "\n\n", "  ", "   "] + (["<start_of_turn>", "<end_of_turn>"] if gemma else [])
    tokens += extra
    types += [CONTROL if t.startswith("<") else USER_DEFINED for t in extra]
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(learned))] + [-1000.0] * len(extra)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_bos_token_id(ids["<bos>" if gemma else "<s>"])
    w.add_eos_token_id(ids["<eos>" if gemma else "</s>"])
    w.add_unk_token_id(ids["<unk>"])
    if gemma:
        w.add_pad_token_id(ids["<pad>"])
        w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
