"""What the conversion knows a source value to be (its abstract kind), between the rules.

- ``Tokens``: the token ids, the graph input the embedding reads.
- ``Past``: a past key or value cache input, ``[B, heads, P, D]``.
- ``Act``: an activation, the source's view of one IR tensor ``[T, C]`` of one sequence (the batch
  dimension ``B`` is 1 in grokc's IR). ``view`` says how the source's axes lay that tensor out:

  ========  =======================  ===========================================
  view      source shape             how it arises
  ========  =======================  ===========================================
  TOKENS    ``[B, S, C]``            hidden states, projections
  SPLIT     ``[B, S, h, d]``         Reshape of TOKENS into heads
  HEADS     ``[B, h, T, d]``         Transpose of SPLIT; rotary and attention in/out
  HEADS5    ``[B, g, r, T, d]``      Unsqueeze/Expand of HEADS (GQA's repeat_kv, ``r`` copies)
  KT        ``[B, h, d, T]``         keys transposed for ``q @ k^T``
  FLAT      ``[B*h, T, d]``          3-D Reshape of HEADS (sdpa's decomposition)
  FLATT     ``[B*h, d, T]``          Transpose of FLAT
  ========  =======================  ===========================================

  ``heads`` and ``head_dim`` are the head split (0 while unknown: TOKENS); ``repeat`` is GQA's
  copy count (the IR tensor holds ``heads / repeat`` heads); ``present`` names the value that
  concatenated the past cache in front (so ``T = P + S``), which is a graph output. ``T`` is ``S``
  otherwise.

Side values (shapes, positions, the mask, constants) have no kind: ``Conversion.is_side``.
"""

from __future__ import annotations

from dataclasses import dataclass

TOKENS, SPLIT, HEADS, HEADS5, KT, FLAT, FLATT = "tokens", "split", "heads", "heads5", "kt", "flat", "flatt"


@dataclass(frozen=True)
class Tokens:
    pass


@dataclass(frozen=True)
class Past:
    input: str


@dataclass(frozen=True)
class Act:
    tensor: str          # the IR tensor ([T, channels]) this value is a view of
    view: str
    channels: int        # C of the IR tensor
    heads: int = 0       # heads in this view (after any repeat)
    head_dim: int = 0
    repeat: int = 1
    present: str | None = None

    @property
    def kv_heads(self) -> int:
        """Heads the IR tensor itself holds."""
        return self.heads // self.repeat

    def shape(self, seq: int, past: int) -> tuple[int, ...]:
        """The source's shape of this value when the graph runs ``seq`` new tokens after ``past``
        cached ones (batch 1)."""
        t = seq + past if self.present else seq
        h, d, r = self.heads, self.head_dim, self.repeat
        return {TOKENS: (1, seq, self.channels), SPLIT: (1, seq, h, d), HEADS: (1, h, t, d),
                HEADS5: (1, h // r, r, t, d), KT: (1, h, d, t), FLAT: (h, t, d), FLATT: (h, d, t)}[self.view]

    def but(self, **changes) -> "Act":
        return Act(**{**self.__dict__, **changes})
