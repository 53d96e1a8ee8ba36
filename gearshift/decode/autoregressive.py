"""Plain autoregressive decoding in one precision mode: one forward, one token per sequence."""

from __future__ import annotations

from gearshift.decode.base import DecodePolicy, Sequence


class AutoregressivePolicy(DecodePolicy):
    name = "ar"

    def step(self, seqs: list[Sequence], sample) -> None:
        tokens, start, n_new = self.batch_tokens(seqs, {s.slot: [s.last_token] for s in seqs})
        with self.timer("decode"):
            logits = self.model(tokens, self.cache, start, n_new, mode=self.mode, logits="last")[:, 0]
            picked = sample(logits[[s.slot for s in seqs]], seqs)
        for s, tok in zip(seqs, picked):
            s.output.append(tok)
        self.counters["forwards"] = self.counters.get("forwards", 0) + 1
