"""What every decode policy shares: per-sequence state and the policy interface.

A policy only decides how the next tokens of a batch are produced (which modes, how many
forwards). The engine owns everything else: admission, stop conditions, trimming tokens a
policy produced past a stop, streaming and statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from gearshift.decode.sampling import SamplingParams
from gearshift.model.kv_cache import KVCache
from gearshift.model.transformer import Transformer


@dataclass
class Sequence:
    index: int  # position of the request in the caller's list
    prompt: list[int]
    params: SamplingParams
    slot: int = -1
    output: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    finished: bool = False
    finish_reason: str | None = None
    stats: dict = field(default_factory=dict)
    checked: int = 0  # output tokens already checked for stop tokens (the check is incremental)
    cached: int = 0  # prompt tokens whose K/V the slot held already (prefix reuse): prefill starts there
    mode: str | None = None  # the precision mode the request asked for (None: the policy's)

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def n_tokens(self) -> int:
        return len(self.prompt) + len(self.output)


class Timer:
    """Accumulates wall time per named phase; synchronizes CUDA so the split is honest."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.totals: dict[str, float] = {}

    def __call__(self, name: str, sync: bool = True):
        """sync=False: host wall time only, for spans that must not wait for work queued ahead."""
        timer = self
        sync = sync and self.cuda

        class _Span:
            def __enter__(self):
                if sync:
                    torch.cuda.synchronize()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if sync:
                    torch.cuda.synchronize()
                timer.totals[name] = timer.totals.get(name, 0.0) + time.perf_counter() - self.t0

        return _Span()

    def add(self, name: str, seconds: float) -> None:
        """Time measured elsewhere (e.g. between CUDA events) into `name`."""
        self.totals[name] = self.totals.get(name, 0.0) + seconds


class DecodePolicy:
    """Base class: prefill a group of new sequences, then step the active batch."""

    name = "base"
    #: cache positions a step may use beyond the tokens it finally keeps (QSPEC: gamma)
    lookahead = 0
    #: every K/V entry below a slot's length was written in the one mode this policy's prefill uses too, so a
    #: later prompt sharing those tokens may start from them (entries a decode step wrote a token at a time can
    #: round differently from a prefill of the same tokens: reuse is a server's choice, `Engine.serve`)
    reuses_prefix = False
    #: samples every token through the engine's `sample` (`sample_rows`), so repetition / frequency / presence
    #: penalties apply as asked; QSPEC's acceptance and GEARBX's device sampler do not, and refuse them
    penalties = False

    def __init__(self, model: Transformer, mode: str = "w4a16"):
        self.model = model
        self.mode = mode
        self.timer = Timer(model.device)
        self.counters: dict[str, float] = {}
        self._host = [None, None]  # `_stage`'s two pinned buffers
        self._flip = 0

    @property
    def modes(self) -> tuple[str, ...]:
        """The precision modes a request may ask this policy for (`Request.mode`)."""
        return (self.mode,)

    #: draws its sampled tokens on the model's device (the engine's `sample_rows`, GEARBX's Gumbel noise), so a
    #: request's generator is made there; QSPEC's acceptance draws on the host
    samples_on_device = False

    @property
    def sample_device(self) -> torch.device:
        """Where a request's random generator lives (`SamplingParams.make_generator`)."""
        return self.model.device if self.samples_on_device else torch.device("cpu")

    def bind(self, cache: KVCache) -> None:
        self.cache = cache

    def batch_tokens(self, seqs: list[Sequence], rows: dict[int, list[int]],
                     cache: KVCache | None = None) -> tuple[torch.Tensor, list[int], list[int]]:
        """Pad per-slot token lists into [cache.batch, T]; returns tokens, start, n_new."""
        cache = self.cache if cache is None else cache
        b = cache.batch
        t = max(len(v) for v in rows.values())
        padded = [[0] * t for _ in range(b)]
        start = [0] * b
        n_new = [0] * b
        for slot, toks in rows.items():
            padded[slot][: len(toks)] = toks
            start[slot] = cache.lengths[slot]
            n_new[slot] = len(toks)
        # one tensor per step, not one per slot: at batch 64 the per-slot version cost ~1 ms of host
        # time per decode step, which the GPU waits for (scratch profile, stop 20)
        return torch.tensor(padded, dtype=torch.long).to(self.model.device), start, n_new

    def prefill(self, seqs: list[Sequence], sample) -> None:
        """Write the prompts (all but their last token, from the first one the slot does not hold) and
        remember nothing else.

        The last prompt token is fed by the first `step`, exactly like every later token, so a
        prompt of length L and a generation continuing it take the same code path.
        """
        rows = {s.slot: s.prompt[s.cached:-1] for s in seqs if len(s.prompt) - 1 > s.cached}
        if rows:
            with self.timer("prefill"):
                for part in self.prefill_groups(rows):
                    self.prefill_rows(part, self.prefill_mode(), "last")

    #: padding token rows (running slots between joining ones, times the group's longest prompt) above which a
    #: prefill is split there: a forward's weight reads cost about what 75 token rows of compute do at 8B scale
    #: (the H100's W4A16 linears: 1.54 ms a step at one token, 6.6 ms at 256)
    split_prefill_rows = 128

    def prefill_groups(self, rows: dict[int, list[int]]) -> list[dict[int, list[int]]]:
        """`rows` (slot -> tokens) as the groups `prefill` runs one forward each. A forward spans its slots
        lowest to highest, so the running slots between two joining ones run padding through every layer:
        where those come to `split_prefill_rows` token rows or more, the group is split there."""
        if not self.compact_prefill:
            return [rows]
        slots = sorted(rows)
        t = max(len(v) for v in rows.values())
        groups, cur = [], [slots[0]]
        for a, b in zip(slots, slots[1:]):
            if (b - a - 1) * t >= self.split_prefill_rows:
                groups.append(cur)
                cur = []
            cur.append(b)
        groups.append(cur)
        return [{slot: rows[slot] for slot in g} for g in groups]

    def prefill_mode(self) -> str:
        return self.mode

    #: prefill only the slots a group of new sequences spans (False: every slot of the batch, as
    #: before stop 48; kept for A/B timing)
    compact_prefill = True

    def prefill_rows(self, rows: dict[int, list[int]], mode: str, logits: str) -> tuple[torch.Tensor, int]:
        """One forward writing `rows` (slot -> tokens) into the cache, over the slots they span only.
        Sequences joining a running batch would otherwise be prefilled in a forward as wide as the
        whole batch (refilling one slot of 8 computed 8 rows per token). Returns the logits and the
        first slot they start at (row r is slot first + r)."""
        lo, hi = (min(rows), max(rows) + 1) if self.compact_prefill else (0, self.cache.batch)
        cache = self.span(hi - lo, lo)
        tokens, start, n_new = self.batch_tokens([], {slot - lo: v for slot, v in rows.items()}, cache)
        out = self.model(tokens, cache, start, n_new, mode=mode, logits=logits, relocatable=True)
        self.unspan(cache, lo)
        return out, lo

    def step(self, seqs: list[Sequence], sample) -> None:
        raise NotImplementedError

    #: a step launched before the previous one was read back (AR, GEARBX): it has `covers` (id(sequence) ->
    #: slot), `start` (the cache offsets it wrote at, per slot) and `ready` (an event after it, or None)
    _ahead = None

    def _drop(self, seqs: list[Sequence], wait: bool = False) -> None:
        """Drop the step launched ahead, giving the positions it wrote in `seqs`' slots back (the next
        step, queued after it, rewrites them with the same values). Slots of sequences that have
        finished since are left alone: the engine resets them for the next sequence."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        if wait and ahead.ready is not None:
            ahead.ready.synchronize()
        for s in seqs:
            if ahead.covers.get(id(s)) == s.slot:
                self.cache.lengths[s.slot] = ahead.start[s.slot]
        self.counters["discarded_forwards"] = self.counters.get("discarded_forwards", 0) + 1

    def _decode_forward(self, seqs: list[Sequence], tokens: torch.Tensor, mode) -> tuple[list[int], torch.Tensor]:
        """Enqueue one decode forward of `seqs` on tokens [W, 1] (host or device) over slots 0 .. W-1 (W: the
        cache's batch, or a `decode_width`); returns the cache offsets it writes at (per slot) and its
        last-position logits [W, V], without waiting."""
        cache = self.span(tokens.shape[0])
        w = cache.batch
        start, n_new = [0] * w, [0] * w
        for s in seqs:
            start[s.slot], n_new[s.slot] = cache.lengths[s.slot], 1
        logits = self.model(tokens, cache, start, n_new, mode=mode, logits="last")[:, 0]
        self.unspan(cache)
        return start, logits

    #: decode over the slots through the highest active one (`decode_width`) instead of every slot; the
    #: policies whose steps do so (AR, QSPEC, GEARBX) set it, and False restores the full-width step for A/B timing
    narrow_decode = False

    def decode_width(self, seqs: list[Sequence]) -> int:
        """Slots a decode step of `seqs` runs: 0 through the highest one in use, rounded up to a power of two
        (each width is a CUDA graph of its own), at most the cache's batch; the batch where `narrow_decode`
        is off. A server with one request in 16 slots otherwise ran every step 16 rows wide: 2.90 ms
        against 2.16 ms for one row at 8B scale on an H200 (stop 57)."""
        b = self.cache.batch
        if not self.narrow_decode:
            return b
        hi, w = max(s.slot for s in seqs) + 1, 1
        while w < hi:
            w *= 2
        return min(w, b)

    def decode_widths(self, b: int) -> list[int]:
        """Every width `decode_width` can pick for a cache of `b` slots (a warm-up runs each)."""
        if not self.narrow_decode:
            return [b]
        out, w = [], 1
        while w < b:
            out.append(w)
            w *= 2
        return out + [b]

    def step_feeds(self) -> range:
        """Tokens per row one decode step can feed: 1, and up to 1 + `lookahead` for QSPEC's verify pass (the last
        token and its drafts). Each is a CUDA graph of its own, which a server's warm-up captures (`warmup_runs`)."""
        return range(1, self.lookahead + 2)

    def span(self, width: int, first: int = 0) -> KVCache:
        """The cache's slots first .. first + width - 1 (the cache itself at full width); `unspan` copies the
        lengths back."""
        return self.cache if width >= self.cache.batch else self.cache.slots(first, width)

    def unspan(self, view: KVCache, first: int = 0) -> None:
        if view is not self.cache:
            self.cache.lengths[first:first + view.batch] = view.lengths

    def _stage(self, values: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        """Queue the copy of `values` to one of two pinned host buffers (so a step's copy never lands in
        the buffer the host is still reading for the step before); returns it and the event to wait on
        (None on CPU, where the copy is done)."""
        cuda = values.is_cuda
        self._flip ^= 1
        host = self._host[self._flip]
        if host is None or host.shape != values.shape or host.dtype != values.dtype:
            host = self._host[self._flip] = torch.empty(values.shape, dtype=values.dtype, pin_memory=cuda)
        host.copy_(values, non_blocking=cuda)
        return host, self._mark(values)

    @staticmethod
    def _mark(t: torch.Tensor) -> "torch.cuda.Event | None":
        """An event recorded after the work queued so far, where `t` is on the GPU (None on the CPU: done)."""
        if not t.is_cuda:
            return None
        ready = torch.cuda.Event()
        ready.record()
        return ready

    def forget(self, s: Sequence) -> None:
        """A long-lived loop (`Engine.serve`) is done with `s`: drop anything kept about it for telemetry."""

    def finish(self) -> None:
        """The engine has no more steps to ask for: drop or wait for any work launched ahead."""
        self._drop([], wait=True)  # (the generation's wall time includes the GPU work it queued)

    def stats(self) -> dict:
        out = {f"{k}_s": round(v, 6) for k, v in self.timer.totals.items()}
        out.update(self.counters)
        return out
