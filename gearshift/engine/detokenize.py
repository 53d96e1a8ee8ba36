"""Text of a growing token list at O(new tokens) per step, for streaming and stop strings.

Decoding a sequence's whole output after every step costs O(length) per step (about 1 ms at 4000
tokens with SmolLM2's tokenizer, per sequence), so streaming a batch or checking stop strings over
long outputs made the host, not the GPU, set the pace. Neither a new token alone nor the new tokens
alone decode to the right text: SentencePiece-style tokenizers drop a leading space at the start of
a decode, and byte-fallback tokens hold parts of one character. So the window decoded starts a few
tokens back, at the last place where text was emitted, and the new text is what the new tokens add
to that window's earlier part; text is held back while it ends in an incomplete character.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """`update(ids)` with the sequence's current output ids returns the text they add; `text` is
    everything so far. Equal to decoding all ids at once for tokenizers whose decode of a window is
    the matching slice of the whole text (all byte-level BPE and SentencePiece ones we load); the
    engine still decodes the whole output once when a sequence finishes."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.text = ""
        self.prefix = 0  # window start: the first token of the last emitted piece
        self.read = 0  # tokens whose text is in self.text
        self.seen = 0  # ids consumed

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def update(self, ids: list[int]) -> str:
        if len(ids) < self.seen:  # ids were trimmed (a stop): start over from the whole list
            self.__init__(self.tokenizer, self.skip)
        self.seen = len(ids)
        if len(ids) == self.read:
            return ""
        before = self._decode(ids[self.prefix:self.read]) if self.read > self.prefix else ""
        window = self._decode(ids[self.prefix:])
        if window.endswith("\ufffd") or len(window) <= len(before) or not window.startswith(before):
            if not window.startswith(before):  # the window re-segmented its own start: decode it all
                whole = self._decode(ids)
                if whole.endswith("\ufffd") or not whole.startswith(self.text):
                    return ""
                new = whole[len(self.text):]
                self.text, self.prefix, self.read = whole, len(ids), len(ids)
                return new
            return ""  # an incomplete character, or nothing visible yet: wait for more tokens
        new = window[len(before):]
        self.text += new
        self.prefix, self.read = self.read, len(ids)
        return new
