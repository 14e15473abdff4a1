"""Token ids to text as they come, with stop strings: what a stream may send so far.

``TextStream(decode, stop).feed(ids)`` takes every id generated so far and returns the text not
yet sent that can no longer change, and whether a stop string ended the text. It holds back a
trailing U+FFFD (the tokenizer renders a UTF-8 character whose bytes are split over tokens so,
until its last byte comes) and a tail that may still grow into a stop string. The text of a stop
string, and anything after it, is never sent (OpenAI's contract).
"""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()):
        self.decode, self.stop = decode, stop
        self.out = ""        # the text returned so far
        self.sent = 0        # its length
        self.stopped = False

    def feed(self, ids: list[int], final: bool = False) -> str:
        """New text from the ids so far; ``final``: no more ids will come, send everything left."""
        text = self.decode(ids)
        hits = [i for i in (text.find(s, max(0, self.sent - len(s) + 1)) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            end = min(hits)
        elif final:
            end = len(text)
        else:
            end = len(text.rstrip("\ufffd"))
            end -= max((k for s in self.stop for k in range(1, min(len(s) - 1, end) + 1)   # the longest tail that
                        if text[:end].endswith(s[:k])), default=0)                          # begins a stop string
        delta = text[self.sent:max(end, self.sent)]
        self.out += delta
        self.sent = len(self.out)
        return delta
