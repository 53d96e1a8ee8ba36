"""Plain autoregressive decoding in one precision mode: one forward, one token per sequence.

On the GPU a batch without penalties runs one step ahead: the step for token n + 1 is launched, fed by
token n on the device (its argmax, or its draw from the request's generator there), before token n is
read back to the host. The host's work between steps
(reading tokens, stop checks, streaming, the next launch) then overlaps the GPU's step instead of
leaving the GPU idle: at batch 1 on an 8B model that work is 0.3-0.4 ms of a 2.7 ms step. The
tokens are the same: they are `sample_rows`' tokens, drawn when the step is taken (a step dropped unread
draws nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gearshift.decode.base import DecodePolicy, Sequence
from gearshift.decode.sampling import put_rows, sample_rows_device, take_rows


@dataclass
class _Launched:
    """A step already on the GPU: which sequences it feeds (by identity, slot), the cache offsets it
    wrote at, and its last-position logits (on the device; its tokens are picked when the step is taken,
    so a step dropped unread never draws from a request's generator)."""

    covers: dict[int, int]  # id(sequence) -> slot
    start: list[int]
    logits: torch.Tensor  # [W, V] for slots 0 .. W-1 (the step's `decode_width`)
    ready: torch.cuda.Event | None  # the forward's end (what `_drop(wait=True)` waits for)


class AutoregressivePolicy(DecodePolicy):
    name = "ar"
    reuses_prefix = True  # one mode for prefill and every step
    penalties = True
    narrow_decode = True  # steps run the slots through the highest active one only
    samples_on_device = True

    def __init__(self, model, mode: str = "w4a16", pipelined: bool | None = None):
        """pipelined: run batches without penalties one step ahead (None: on a CUDA model, where it pays)."""
        super().__init__(model, mode)
        self.pipelined = model.device.type == "cuda" if pipelined is None else pipelined
        self._ahead: _Launched | None = None
        self.counters.update(forwards=0, discarded_forwards=0)

    def step(self, seqs: list[Sequence], sample) -> None:
        if self.pipelined and not any(s.params.penalized for s in seqs):
            return self._step_ahead(seqs)
        self._drop(seqs)
        cache = self.span(self.decode_width(seqs))
        tokens, start, n_new = self.batch_tokens(seqs, {s.slot: [s.last_token] for s in seqs}, cache)
        with self.timer("decode"):
            logits = self.model(tokens, cache, start, n_new, mode=self.mode, logits="last")[:, 0]
            self.unspan(cache)
            picked = sample(logits[[s.slot for s in seqs]], seqs)
        for s, tok in zip(seqs, picked):
            s.output.append(tok)
        self.counters["forwards"] += 1

    def _step_ahead(self, seqs: list[Sequence]) -> None:
        with self.timer("decode", sync=False):  # a sync here would wait for the step launched ahead
            cur = self._ahead
            if cur is None or any(cur.covers.get(id(s)) != s.slot for s in seqs):
                self._drop(seqs)  # (a sequence joined: recompute everyone's step, same tokens)
                tokens, _, _ = self.batch_tokens(seqs, {s.slot: [s.last_token] for s in seqs},
                                                 self.span(self.decode_width(seqs)))
                cur = self._launch(seqs, tokens)
            ids = self._pick(cur.logits, seqs)
            host, ready = self._stage(ids)
            # the next step, for the sequences that will still want a token after this one (as wide as
            # they need: never wider than this step, whose tokens feed it); queued after this step's
            # picking, since a graph replay rewrites the logits buffer it read
            more = [s for s in seqs if len(s.output) + 1 < s.params.max_new_tokens]
            self._ahead = self._launch(more, ids[:self.decode_width(more)].view(-1, 1)) if more else None
            if ready is not None:
                ready.synchronize()  # this step's tokens, not the one just launched
            picked = host.tolist()
        for s in seqs:
            s.output.append(picked[s.slot])
        self.counters["forwards"] += 1

    @staticmethod
    def _pick(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Tokens [W] on the device, without a sync: the argmax, and for sampled rows `sample_rows`' draw (the
        same rows, in the same order, as the engine's `sample` gets them: the same tokens)."""
        ids = logits.argmax(-1)
        drawn = [s for s in seqs if not s.params.greedy]
        if drawn:
            slots = [s.slot for s in drawn]
            put_rows(ids, slots, sample_rows_device(take_rows(logits, slots), [s.params for s in drawn],
                                                    [s.generator for s in drawn]))
        return ids

    def _launch(self, seqs: list[Sequence], tokens: torch.Tensor) -> _Launched:
        """Enqueue one decode step of `seqs` on tokens [W, 1] (device: slots 0 .. W-1); returns without
        waiting."""
        start, logits = self._decode_forward(seqs, tokens, self.mode)
        ready = self._mark(logits)
        return _Launched({id(s): s.slot for s in seqs}, start, logits, ready)
