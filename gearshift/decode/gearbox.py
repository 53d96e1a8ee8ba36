"""GEARBX decode policy: the generation loop of the paper's Listing 2, for a continuous batch.

Per request (``prefill``):

1. reset the sequence's monitor row (window, counters, calibration: a new request calibrates
   from its own prefill);
2. cold-start gear from the :class:`PromptClassifier` (paper 11), or ``initial_gear``;
3. shift to that gear and prefill the prompt (all but its last token) with ``logits="all"``;
4. unless ``calibrate=False``: percentile calibration of the row's thresholds from the prefill
   logits' entropies (paper 4.1 / 4.2 PyTorch caps).  One host sync per prefill group.

Per decode step (``step``) of the active batch:

1. the batch rule turns the rows' gears into forward passes (below) and the manager shifts;
2. forward the last token of every sequence (mode ``"native"``: each layer runs the store it
   holds, 16-bit activations);
3. NaN guard (``nan_to_num(0, 1e4, -1e4)``, unconditional), entropy dispatched on the device;
4. sampling on the device: greedy rows take the argmax (equal to the engine's greedy
   sampler), sampling rows use temperature, min-p (top-k / top-p if asked, via the shared
   ``filtered_logprobs``) and Gumbel-max with the sequence's own generator;
5. ONE device->host copy of the sampled ids and the entropies (``EntropyMonitor.fetch``);
   the monitor commits them: window mean, hysteresis, minimum gear duration, catastrophic
   fallback, slope prediction;
6. pre-warming: a predicted gear (slope prediction, paper 3.5) that has not been built yet is
   quantized now, so the later shift into it is a cached re-entry.

On CUDA a one-forward step runs one step ahead (``pipelined``): after step n's ids and entropies
are queued for the host, step n + 1 is launched in step n's gear on those ids on the device, and
the host's work of step 5 overlaps it. A shift (or a sequence joining) drops that step and
recomputes it in the new gear: same tokens, same telemetry (stop 49: 1.11-1.20x tok/s at batch
1 / 4 / 16 on 8B shapes, ``benchmarks/loop_ab.py --policies gearbox``).

The monitor decides each sequence's gear on its own; the precision manager can hold only one
gear per layer at a time.  **Batch rule** (``batch_rule``):

* ``"max"`` (default): one forward per step in the highest gear any active sequence wants
  (``EntropyMonitor.batch_gear``).  No sequence ever gets less precision than its monitor
  chose; sequences that wanted a lower gear get more (their tokens are counted under the gear
  that actually ran: ``gear_counts``; what they wanted: ``wanted_gear_counts``).  The manager
  works as in the paper: originals offloaded to the host in a quantized gear, one quantized
  gear resident.
* ``"split"``: the active rows are grouped by wanted gear and each group runs its own forward
  in its own gear (rows of the other groups ride along with no new tokens).  Every sequence
  gets exactly its gear, at the price of one weight read per distinct gear per step.  Because
  a step can then shift several times, the manager keeps every gear it built resident on the
  device (``offload_originals=False``, ``cache_device="device"``): shifts are pointer swaps and
  device memory holds all gears in use -- the dispatch-based design the paper contrasts
  itself with, made explicit.

Telemetry: each sequence's ``s.stats["gearbox"]`` holds its per-token ``entropy`` (raw, bits),
``mean_entropy`` (window mean), ``gear`` (the gear of the forward that produced the token),
``wanted_gear`` (the sequence's own monitor gear for that forward), its thresholds,
calibration and cold-start facts.  ``stats()`` adds ``gear_counts`` (tokens per forward gear),
``wanted_gear_counts``, ``forwards_by_gear``, ``sequence_shifts`` (monitor shifts of all rows),
and the manager's ``shift_count``, ``shift_cost_s`` (split by first entry / cached / back to
high / pre-warm) and managed-weight device bytes per gear.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gearshift.decode.base import DecodePolicy, Sequence
from gearshift.decode.entropy import (GEAR_RANK, GEARS, MIN_GEAR_DURATION, WINDOW, EntropyMonitor, PromptClassifier,
                                      entropy_bits, max_gear)
from gearshift.decode.gumbel import gumbel_noise, min_p_filter, sanitize_logits
from gearshift.decode.precision import PrecisionManager
from gearshift.decode.sampling import filtered_logprobs

BATCH_RULES = ("max", "split")
MODE = "native"


@dataclass
class _Launched:
    """A decode forward already on the GPU: the sequences it feeds (by identity, slot), the cache
    offsets it wrote at, the gear it ran in and its last-position logits [W, V] (slots 0 .. W-1)."""

    covers: dict[int, int]
    start: list[int]
    gear: str
    logits: torch.Tensor
    ready: torch.cuda.Event | None  # recorded after the forward (None on CPU)


def parse_gears(spec) -> tuple[str, ...]:
    """"low,mid,high" / ["low", "high"] -> the allowed gears in precision order."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for g in items:
        g = g.strip()
        if not g:
            continue
        if g not in GEAR_RANK:
            raise ValueError(f"unknown gear {g!r} (gears: {', '.join(GEARS)})")
        if g not in out:
            out.append(g)
    if not out:
        raise ValueError("at least one gear must be allowed")
    return tuple(sorted(out, key=GEAR_RANK.__getitem__))


class GearboxPolicy(DecodePolicy):
    name = "gearbox"
    narrow_decode = True  # steps run the slots through the highest active one (the monitor pads the rest)
    samples_on_device = True

    def __init__(self, model, *, tokenizer=None, prompt_texts: list[str] | None = None, manage: str = "attention",
                 gears="low,mid,high", batch_rule: str = "max", calibrate: bool = True, initial_gear: str = "auto",
                 window: int = WINDOW, min_gear_duration: int = MIN_GEAR_DURATION, prewarm: bool = True,
                 resident: bool | None = None, monitor_kwargs: dict | None = None, classifier=None,
                 manager: PrecisionManager | None = None, pipelined: bool | None = None):
        """pipelined: launch each one-forward step before the previous one is read back (None: on a
        CUDA model, where the host's work between steps would otherwise leave the GPU idle)."""
        super().__init__(model, mode=MODE)
        if batch_rule not in BATCH_RULES:
            raise ValueError(f"batch_rule must be one of {', '.join(BATCH_RULES)}")
        if initial_gear != "auto" and initial_gear not in GEAR_RANK:
            raise ValueError(f"initial_gear must be auto or one of {', '.join(GEARS)}")
        self.gears = parse_gears(gears)
        self.batch_rule = batch_rule
        self.calibrate = calibrate
        self.initial_gear = initial_gear
        self.prewarm_enabled = prewarm
        self.tokenizer = tokenizer
        self.prompt_texts = prompt_texts
        self.classifier = classifier or PromptClassifier()
        self.monitor_kwargs = dict(window=window, min_gear_duration=min_gear_duration, **(monitor_kwargs or {}))
        if resident is None:
            resident = batch_rule == "split"
        self.manager = manager or PrecisionManager(model, manage, offload_originals=not resident,
                                                   cache_device="device" if resident else "host")
        self.monitor: EntropyMonitor | None = None
        self.vocab_size = model.config.vocab_size
        self.counters = {"forwards": 0, "steps": 0, "sequence_shifts": 0, "prewarms": 0,
                         "gear_counts": {g: 0 for g in GEARS}, "wanted_gear_counts": {g: 0 for g in GEARS},
                         "forwards_by_gear": {g: 0 for g in GEARS}, "catastrophic_fallbacks": 0,
                         "discarded_forwards": 0}
        self.pipelined = model.device.type == "cuda" if pipelined is None else pipelined
        self._ahead: _Launched | None = None
        self.monitor_s = 0.0
        #: every sequence this policy has served (for telemetry hooks)
        self.sequences: list[Sequence] = []
        #: called with the policy once generation ends (stats()); the CLI renders --trace-out here
        self.on_finish = None

    def forget(self, s: Sequence) -> None:
        self.sequences = [x for x in self.sequences if x is not s]  # a server's must not pile up with their traces

    # ---- helpers -----------------------------------------------------------------------------
    def allowed(self, gear: str) -> str:
        """The allowed gear serving a wanted gear: the lowest allowed one at least as precise,
        else the most precise allowed (``--gears high`` pins high, ``--gears low`` forces low)."""
        for g in self.gears:
            if GEAR_RANK[g] >= GEAR_RANK[gear]:
                return g
        return self.gears[-1]

    def bind(self, cache) -> None:
        super().bind(cache)
        self.monitor = EntropyMonitor(self.vocab_size, cache.batch, **self.monitor_kwargs)

    def _prompt_text(self, s: Sequence) -> str | None:
        if self.prompt_texts is not None and 0 <= s.index < len(self.prompt_texts):
            return self.prompt_texts[s.index]
        if self.tokenizer is not None:
            return self.tokenizer.decode(s.prompt, skip_special_tokens=True)
        return None

    def _cold_start(self, s: Sequence) -> tuple[str, float | None]:
        if self.initial_gear != "auto":
            return self.allowed(self.initial_gear), None
        text = self._prompt_text(s)
        if text is None:
            return self.allowed("high"), None
        f = self.classifier.features(text)
        return self.allowed(f.gear), f.score

    def _shift(self, gear: str) -> None:
        with self.timer("shift"):
            self.manager.shift(gear)

    def _groups(self, seqs: list[Sequence], wanted: dict[int, str]) -> list[tuple[str, list[Sequence]]]:
        if self.batch_rule == "max":
            return [(self.allowed(max_gear(wanted[s.slot] for s in seqs)), seqs)]
        by: dict[str, list[Sequence]] = {}
        for s in seqs:
            by.setdefault(self.allowed(wanted[s.slot]), []).append(s)
        # the manager's current gear first: one shift fewer per step
        return sorted(by.items(), key=lambda kv: (kv[0] != self.manager.gear, GEAR_RANK[kv[0]]))

    # ---- prefill ---------------------------------------------------------------------------------
    def prefill(self, seqs: list[Sequence], sample) -> None:
        wanted = {}
        for s in seqs:
            gear, score = self._cold_start(s)
            self.monitor.reset(s.slot, gear=gear, keep_calibration=False)
            wanted[s.slot] = gear
            self.sequences.append(s)
            s.stats["gearbox"] = {"initial_gear": gear, "prompt_score": score, "calibrated": False,
                                  "entropy": [], "mean_entropy": [], "gear": [], "wanted_gear": []}
        pending = []  # (seq, device entropies)
        for gear, group in self._groups(seqs, wanted):
            rows = {s.slot: s.prompt[:-1] for s in group if len(s.prompt) > 1}
            self._shift(gear)
            if not rows:
                continue
            with self.timer("prefill"):
                for part in self.prefill_groups(rows):
                    logits, lo = self.prefill_rows(part, MODE, "all" if self.calibrate else "last")
                    self.counters["forwards"] += 1
                    if self.calibrate:
                        for s in group:
                            if s.slot in part:
                                z = sanitize_logits(logits[s.slot - lo, : len(part[s.slot])])
                                pending.append((s, entropy_bits(z)))
        if pending:  # one device->host copy for the whole prefill group
            host = torch.cat([e for _, e in pending]).tolist()
            i = 0
            for s, e in pending:
                vals = host[i: i + e.numel()]
                i += e.numel()
                ok = self.monitor.calibrate(s.slot, vals)
                s.stats["gearbox"]["calibrated"] = ok
        for s in seqs:
            lo, hi = self.monitor.thresholds(s.slot)
            s.stats["gearbox"]["theta_low"], s.stats["gearbox"]["theta_high"] = round(lo, 4), round(hi, 4)

    # ---- decode ----------------------------------------------------------------------------------
    def _sample(self, z: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Listing 2 sampling on the device: argmax for greedy rows, min-p + Gumbel-max otherwise."""
        ids = z.argmax(-1)
        for s in seqs:
            p = s.params
            if p.greedy:
                continue
            if p.top_k or p.top_p < 1:
                row = filtered_logprobs(z[s.slot], p)  # temperature, top-k, top-p, min-p
            else:
                row = min_p_filter(z[s.slot].float() / p.temperature, p.min_p)
            gen = s.generator
            noise = gumbel_noise(row.shape, gen, device=gen.device if gen is not None else row.device)
            ids[s.slot] = (row + noise.to(row.device, non_blocking=True)).argmax(-1)
        return ids

    def step(self, seqs: list[Sequence], sample) -> None:
        b = self.cache.batch
        active = [False] * b
        for s in seqs:
            active[s.slot] = True
        wanted = {s.slot: self.monitor.gear(s.slot) for s in seqs}
        groups = self._groups(seqs, wanted)
        if self.pipelined and len(groups) == 1:
            return self._step_ahead(seqs, groups[0][0], wanted, active)
        self._drop(seqs)
        ran: dict[int, str] = {}
        z = None
        cache = self.span(self.decode_width(seqs))  # every group's forward as wide, so their rows line up in z
        for gear, group in groups:
            self._shift(gear)
            tokens, start, n_new = self.batch_tokens(group, {s.slot: [s.last_token] for s in group}, cache)
            with self.timer("decode"):
                out = self.model(tokens, cache, start, n_new, mode=MODE, logits="last")[:, 0]
                self.unspan(cache)
            if len(groups) == 1:
                z = out
            else:
                if z is None:
                    z = torch.zeros_like(out)
                idx = torch.tensor([s.slot for s in group], device=out.device)
                z[idx] = out[idx]
            for s in group:
                ran[s.slot] = gear
            self._count_forward(gear)
        with self.timer("sample_monitor"):
            t0 = time.perf_counter()
            ids = self._sample_and_dispatch(z, seqs)
            host_ids, decisions = self.monitor.fetch(ids, active)  # the step's one device->host copy
            self.monitor_s += time.perf_counter() - t0
        self._record(seqs, host_ids, decisions, ran, wanted)

    def _count_forward(self, gear: str) -> None:
        self.counters["forwards"] += 1
        self.counters["forwards_by_gear"][gear] += 1

    def _sample_and_dispatch(self, z: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """NaN guard, the entropy launched (kept pending in the monitor), the ids sampled: all on the
        device, no sync."""
        z = sanitize_logits(z)  # NaN guard, unconditional (no sync)
        self.monitor.dispatch(z)  # entropy stays on the device
        return self._sample(z, seqs)

    def _step_ahead(self, seqs: list[Sequence], gear: str, wanted: dict[int, str], active: list[bool]) -> None:
        """One step of a one-forward batch, with the next step launched before this one is read back.

        The next step is launched in the gear of this one (a bet that no row shifts, which the
        minimum gear duration makes the common case) on this step's sampled ids on the device, after
        this step's ids and entropies were queued for the host. The host then waits for this step
        only, commits its entropies and, while the next step runs, does the monitor's and the
        telemetry's bookkeeping. A step whose gear, sequences or manager state turn out different
        is dropped and recomputed (same values: the same forward on the same tokens)."""
        cur = self._ahead
        if (cur is None or cur.gear != gear or self.manager.gear != gear
                or any(cur.covers.get(id(s)) != s.slot for s in seqs)):
            self._drop(seqs)
            self._shift(gear)  # (a shift synchronizes first: the dropped step never sees the new stores)
            with self.timer("decode", sync=False):  # a sync here would wait for the step launched ahead
                tokens, _, _ = self.batch_tokens(seqs, {s.slot: [s.last_token] for s in seqs},
                                                 self.span(self.decode_width(seqs)))
                cur = self._launch(seqs, tokens, gear)
        self._count_forward(gear)
        with self.timer("sample_monitor", sync=False):
            t0 = time.perf_counter()
            ids = self._sample_and_dispatch(cur.logits, seqs)
            host, ready = self._stage(self.monitor.staged(ids))
            self.monitor_s += time.perf_counter() - t0
        with self.timer("decode", sync=False):
            # (queued after this step's sampling: a graph replay may rewrite the logits buffer it read)
            more = [s for s in seqs if len(s.output) + 1 < s.params.max_new_tokens]
            self._ahead = self._launch(more, ids[:self.decode_width(more)].view(-1, 1), gear) if more else None
        with self.timer("sample_monitor", sync=False):
            t0 = time.perf_counter()
            if ready is not None:
                ready.synchronize()  # this step's values, not the step just launched
            host_ids, host_h = host.tolist()
            decisions = self.monitor.commit(host_h, active)
            self.monitor_s += time.perf_counter() - t0
        self._record(seqs, [int(i) for i in host_ids], decisions, {s.slot: gear for s in seqs}, wanted)

    def _launch(self, seqs: list[Sequence], tokens: torch.Tensor, gear: str) -> _Launched:
        """Enqueue one decode forward of `seqs` on tokens [W, 1] (device: slots 0 .. W-1) in the current
        gear; returns without waiting."""
        start, logits = self._decode_forward(seqs, tokens, MODE)
        ready = self._mark(logits)
        return _Launched({id(s): s.slot for s in seqs}, start, gear, logits, ready)

    def _record(self, seqs: list[Sequence], host_ids: list[int], decisions, ran: dict[int, str],
                wanted: dict[int, str]) -> None:
        """The step's tokens, telemetry and counters on the host, then pre-warming (paper 3.5)."""
        self.counters["steps"] += 1
        predicted = set()
        for s in seqs:
            d = decisions[s.slot]
            s.output.append(host_ids[s.slot])
            tr = s.stats["gearbox"]
            tr["entropy"].append(round(d.entropy, 4))
            tr["mean_entropy"].append(round(d.mean_entropy, 4))
            tr["gear"].append(ran[s.slot])
            tr["wanted_gear"].append(wanted[s.slot])
            self.counters["gear_counts"][ran[s.slot]] += 1
            self.counters["wanted_gear_counts"][self.allowed(wanted[s.slot])] += 1
            if d.shifted:
                self.counters["sequence_shifts"] += 1
                tr["shifts"] = tr.get("shifts", 0) + 1
            if d.catastrophic:
                self.counters["catastrophic_fallbacks"] += 1
            predicted.add(self.allowed(d.predicted_gear))
            predicted.add(self.allowed(d.gear))
        if self.prewarm_enabled:
            for g in sorted(predicted, key=GEAR_RANK.__getitem__):
                if g != "high" and g not in self.manager.built_gears():
                    with self.timer("prewarm"):
                        if self.manager.prewarm(g) is not None:
                            self.counters["prewarms"] += 1

    # ---- telemetry -------------------------------------------------------------------------------
    def stats(self) -> dict:
        if self.on_finish is not None:
            hook, self.on_finish = self.on_finish, None
            hook(self)
        out = super().stats()
        tokens = sum(self.counters["gear_counts"].values())
        out["gear_distribution"] = {g: round(n / tokens, 4) if tokens else 0.0
                                    for g, n in self.counters["gear_counts"].items()}
        out["batch_rule"] = self.batch_rule
        out["gears"] = list(self.gears)
        out["monitor_host_s"] = round(self.monitor_s, 6)
        out.update(self.manager.stats())
        out["shifts"] = [r.as_dict() for r in self.manager.history]
        return out

    def close(self) -> None:
        """Return the model to high gear (the unmodified model)."""
        self.manager.restore()
