"""QSPEC: draft with a low-precision activation mode, verify with W4A16, of ONE quantized model.

One cycle for the active batch (paper section 3.1):

1. *Draft*: gamma forwards with T = 1 in the draft mode (default w4a4). Row b feeds its last
   token, then each drafted token; the draft K/V land in the shared cache at the row's next
   positions. Rows draft fewer tokens near the end of their budget (never past max_new_tokens
   or the cache) and stop drafting right after a drafted stop token.
2. *Verify*: ONE forward of [last token, d_1..d_g] per row in the verify mode (default w4a16),
   started at the position of the last token, so its K/V **overwrite** the draft entries
   (QSPEC's KV overwrite) and give the verify distributions p_1..p_{g+1}.
3. *Accept*: a prefix d_1..d_n per row (rows accept different counts in the same cycle), then
   one verify-mode token: the correction at the first rejection, or the bonus token p_{g+1}.
   Rejected positions are truncated from the cache.

Acceptance: greedy rows (temperature 0) accept d_i iff it is the verify mode's first argmax,
so greedy QSPEC is token-for-token greedy autoregressive decoding in the verify mode. Sampled
rows use the rejection rule of Leviathan et al. (2023): accept d_i ~ q_i with probability
min(1, p_i(d_i) / q_i(d_i)), else sample from norm(max(0, p_i - q_i)); p and q are both
`filtered_logprobs` of the request's SamplingParams, so the output follows the verify mode's
sampling distribution exactly. The chained cycle (the default on CUDA) draws the drafts and runs
the rule on the device for all sampled rows at once (`accept_rows`), with one read back per cycle;
the step-by-step cycle runs it on the host, row by row (`accept_sampled`). `acceptance="greedy"`
is the paper's evaluation setting: every request decodes greedily (draft argmax, accept on top-1
match), whatever its temperature.

Memory: the draft and verify forwards call the same QuantLinear stores and write the same
KVCache; nothing of model or cache size is allocated. `kv_overwrite=False` is the ablation in
which accepted positions keep the draft mode's K/V: the verify pass still computes its own K/V
for its window (it needs them for its attention), and afterwards the draft entries of that
window (at most gamma positions per row, backed up before the verify) are written back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from gearshift.decode.base import DecodePolicy, Sequence
from gearshift.decode.sampling import device_index, draw_rows, filtered_logprobs_rows, put_rows, take_rows
from gearshift.errors import GearshiftError
from gearshift.quant.modes import get_mode

ACCEPTANCE_RULES = ("auto", "greedy")


@dataclass
class _DraftsAhead:
    """The next cycle's drafts, queued behind a verify pass before its results were read back, at the
    positions the device derived from that verify (`QSpecPolicy._launch_ahead`). They are used only
    if the host, once it has the results, finds the next cycle to be exactly the one they assumed."""

    covers: dict[int, int]  # id(sequence) -> slot of the cycle they were queued for
    picked: list[torch.Tensor]  # each draft step's tokens [cache.batch, 1], on the device
    last: torch.Tensor  # each row's last token [cache.batch, 1] (the verify's correction or bonus), on the device
    events: tuple | None  # CUDA events around the draft steps
    ready: torch.cuda.Event | None = None  # after the last draft step (for `finish`)
    expect: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # slot -> (base, budget, last token)


class _SampledDrafts:
    """A cycle's sampled rows on the device (`QSpecPolicy._cycle_on_device`): each draft step draws their tokens from
    their filtered draft distribution q and keeps q for the acceptance. A row draws from its own generator only,
    a fixed amount per cycle (one noise vector per draft, its budget's uniforms and one noise vector at the
    acceptance), so its tokens do not depend on the rows batched with it."""

    def __init__(self, seqs: list[Sequence], budget: dict[int, int]):
        self.slots = [s.slot for s in seqs]
        self.params = [s.params for s in seqs]
        self.gens = [s.generator for s in seqs]
        self.budget = [budget[s.slot] for s in seqs]
        self.steps = max(budget.values(), default=0)  # the cycle's draft steps: the longest budget of any row
        self.q: torch.Tensor | None = None  # [rows, steps, V]: zero past a row's budget
        self.p: torch.Tensor | None = None  # [rows, longest budget + 1, V]: the verify distributions

    def draw(self, j: int, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """Draft step j: logits [cache.batch, V]; the drafting rows' tokens go into tokens [cache.batch, 1]."""
        js = [i for i, b in enumerate(self.budget) if b > j]
        if not js:
            return
        if self.q is None:
            self.q = torch.zeros((len(self.slots), self.steps, logits.shape[-1]), device=logits.device)
        slots = [self.slots[i] for i in js]
        q = filtered_logprobs_rows(take_rows(logits, slots).float(), [self.params[i] for i in js]).exp()
        put_rows(self.q[:, j], js, q)
        put_rows(tokens[:, 0], slots, draw_rows(q, [self.gens[i] for i in js]))

    def accept(self, policy: "QSpecPolicy", logits: torch.Tensor, picked: list[torch.Tensor]) -> torch.Tensor:
        """(accepted drafts, token to append) per slot [cache.batch, 2] (zero at other slots) from the verify
        logits [cache.batch, 1 + longest budget, V] and the drafts picked [cache.batch, 1] per step."""
        g = len(picked)
        self.p = filtered_logprobs_rows(take_rows(logits, self.slots).float(), self.params).exp()
        q = self.q if self.q is not None else self.p.new_zeros((len(self.slots), g, logits.shape[-1]))
        d = take_rows(torch.cat(picked, 1), self.slots) if g else q.new_zeros((len(self.slots), 0), dtype=torch.long)
        n, tok = policy.accept_rows(self.p, q, d, self.budget, self.gens)
        out = torch.zeros((logits.shape[0], 2), dtype=torch.long, device=logits.device)
        put_rows(out, self.slots, torch.stack([n, tok], 1))
        return out

    def bonus(self, slot: int, at: int) -> int:
        """A token from the verify distribution at position `at` of the row in `slot` (a stop token among its
        drafts ended them early, and every one kept was accepted)."""
        i = self.slots.index(slot)
        return int(draw_rows(self.p[i, at].unsqueeze(0), [self.gens[i]])[0])


def tokens_per_cycle(alpha: float, gamma: int) -> float:
    """Expected tokens per cycle with i.i.d. per-token acceptance alpha (Leviathan et al., eq. 1)."""
    if alpha >= 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def modeled_speedup(pm, model, draft_mode: str, verify_mode: str, gamma: int, batch: int,
                    alpha: float) -> dict | None:
    """DESIGN.md's speed-up of QSPEC over plain decoding in the verify mode, from the policy map's
    kernel times of the model's linears: tokens_per_cycle x t_verify(B) / (gamma t_draft(B) +
    t_verify(B (gamma + 1))). None when the map does not cover the model's shapes."""
    from gearshift.dispatch.step_cost import linear_step_us

    lins = list(model.linear_layers())
    t_ar = linear_step_us(pm, lins, verify_mode, batch)
    t_draft = linear_step_us(pm, lins, draft_mode, batch)
    t_verify = linear_step_us(pm, lins, verify_mode, batch * (gamma + 1))
    if None in (t_ar, t_draft, t_verify):
        return None
    tpc = tokens_per_cycle(alpha, gamma)
    return {"batch": batch, "gamma": gamma, "alpha": alpha, "t_draft_ms": t_draft / 1e3, "t_ar_ms": t_ar / 1e3,
            "t_verify_ms": t_verify / 1e3, "speedup": tpc * t_ar / (gamma * t_draft + t_verify)}


class QSpecPolicy(DecodePolicy):
    name = "qspec"
    narrow_decode = True  # a cycle runs the slots through the highest active one only

    def __init__(self, model, draft_mode: str = "w4a4", verify_mode: str = "w4a16", gamma: int = 3,
                 kv_overwrite: bool = True, acceptance: str = "auto", chained_drafts: bool | None = None,
                 cycle_ahead: bool | None = None):
        """chained_drafts: in all-greedy batches, each draft step reads the previous one's argmax on the
        device, and the verify pass reads the drafts there too: one read back per cycle instead of
        gamma + 1 (with kv_overwrite off, the drafts are read before the verify, which backs up their
        K/V). None: on a CUDA model, where every read leaves the GPU idle.
        cycle_ahead: with chained drafts, queue the next cycle's drafts behind each verify pass before
        reading it back, at the accepted lengths the device computes, so the GPU drafts while the host
        accepts, streams and checks stops. Used only where the next cycle turns out to be the one they
        assumed (same sequences, no stop among the drafts), else dropped and redone: same tokens.
        None: with chained drafts on a CUDA model."""
        super().__init__(model, verify_mode)
        self.chained_drafts = model.device.type == "cuda" if chained_drafts is None else chained_drafts
        self.cycle_ahead = (self.chained_drafts and model.device.type == "cuda") if cycle_ahead is None \
            else bool(cycle_ahead)
        self._ahead: _DraftsAhead | None = None
        dm, vm = get_mode(draft_mode), get_mode(verify_mode)
        if int(gamma) < 1:
            raise GearshiftError(f"gamma (draft length) must be >= 1, got {gamma}")
        if acceptance not in ACCEPTANCE_RULES:
            raise GearshiftError(f"unknown acceptance rule {acceptance!r}; choose one of {', '.join(ACCEPTANCE_RULES)}")
        if dm.weight_bits != vm.weight_bits:
            raise GearshiftError(f"draft mode {dm.name} and verify mode {vm.name} read different weight widths "
                                 f"({dm.weight_bits} vs {vm.weight_bits} bits); QSPEC shares one weight store")
        self.draft_mode, self.verify_mode = dm.name, vm.name
        self.gamma = int(gamma)
        self.lookahead = self.gamma
        self.kv_overwrite = bool(kv_overwrite)
        self.acceptance = acceptance
        # chained cycles draw sampled drafts and run the acceptance on the device (`_SampledDrafts`); the
        # step-by-step cycle draws on the host
        self.samples_on_device = self.chained_drafts and self.kv_overwrite
        eos = model.config.eos_token_id
        self._model_eos = set(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
        for k in ("cycles", "draft_forwards", "verify_forwards", "drafted", "accepted", "seq_cycles", "emitted",
                  "cycles_ahead", "discarded_draft_forwards"):
            self.counters[k] = 0

    # -- helpers -------------------------------------------------------------------------------
    def prefill_mode(self) -> str:
        return self.verify_mode

    def _greedy(self, s: Sequence) -> bool:
        return self.acceptance == "greedy" or s.params.greedy

    def _stops(self, s: Sequence) -> set[int]:
        p = s.params
        if p.stop_token_ids is not None:
            return set(p.stop_token_ids)
        return set() if p.ignore_eos else self._model_eos

    def _budget(self, s: Sequence, produced: int | None = None, cached: int | None = None) -> int:
        """Tokens this row may draft this cycle: the cycle emits at most budget + 1 tokens. produced /
        cached: its output and cache lengths (default: now; a later cycle's for drafts queued ahead)."""
        produced = len(s.output) if produced is None else produced
        cached = self.cache.lengths[s.slot] if cached is None else cached
        room = self.cache.capacity - cached - 1  # the verify writes budget + 1 positions
        return max(0, min(self.gamma, s.params.max_new_tokens - produced - 1, room))

    @staticmethod
    def _draw(probs: torch.Tensor, generator) -> int:
        return int(torch.multinomial(probs, 1, generator=generator).item())

    @staticmethod
    def _uniform(generator) -> float:
        return float(torch.rand((), generator=generator).item())

    # -- one cycle -----------------------------------------------------------------------------
    def step(self, seqs: list[Sequence], sample) -> None:
        """One cycle over the slots through the highest active one (`decode_width`): the cycle runs on a view
        of the cache's first slots, and drafts queued ahead at another width are dropped (recomputed: the
        same tokens)."""
        full, view = self.cache, self.span(self.decode_width(seqs))
        if self._ahead is not None and self._ahead.last.shape[0] != view.batch:
            self._discard_ahead()
        self.cache = view
        try:
            self._cycle_step(seqs)
        finally:
            self.cache = full
            self.unspan(view)

    def _cycle_step(self, seqs: list[Sequence]) -> None:
        cache = self.cache
        base = {s.slot: cache.lengths[s.slot] for s in seqs}
        for s in seqs:
            if base[s.slot] != s.n_tokens - 1:
                raise GearshiftError(f"slot {s.slot}: cache holds {base[s.slot]} tokens, expected {s.n_tokens - 1}")
        budget = {s.slot: self._budget(s) for s in seqs}
        drafts: dict[int, list[int]] = {s.slot: [] for s in seqs}
        qprobs: dict[int, list[torch.Tensor]] = {s.slot: [] for s in seqs}  # sampled rows only, host [V]
        drafting = [s for s in seqs if budget[s.slot] > 0]

        greedy_chain = self.chained_drafts and all(self._greedy(s) for s in seqs)
        if self.chained_drafts and self.kv_overwrite:
            results = self._cycle_on_device(seqs, drafting, base, budget, drafts)
        else:
            self._discard_ahead()
            results = self._cycle(seqs, drafting, base, budget, drafts, qprobs, greedy_chain)

        self.counters["cycles"] += 1
        for s, (n_acc, extra) in zip(seqs, results):
            g = len(drafts[s.slot])
            s.output.extend(drafts[s.slot][:n_acc])
            s.output.append(extra)
            cache.truncate(s.slot, base[s.slot] + n_acc + 1)  # the cache holds all but the new last token
            self.counters["drafted"] += g
            self.counters["accepted"] += n_acc
            self.counters["seq_cycles"] += 1
            self.counters["emitted"] += n_acc + 1
            st = s.stats
            st["qspec_cycles"] = st.get("qspec_cycles", 0) + 1
            st["drafted"] = st.get("drafted", 0) + g
            st["accepted"] = st.get("accepted", 0) + n_acc
            st["acceptance_rate"] = round(st["accepted"] / st["drafted"], 4) if st["drafted"] else None
            st["mean_accepted_length"] = round((st["accepted"] + st["qspec_cycles"]) / st["qspec_cycles"], 4)

    def _cycle(self, seqs, drafting, base, budget, drafts, qprobs, greedy_chain: bool) -> list[tuple[int, int]]:
        """Drafts read back as they are made (or, greedy_chain, once per cycle), then the verify pass."""
        cache = self.cache
        with self.timer("draft"):
            if greedy_chain and drafting:
                self._draft_chained(drafting, base, budget, drafts)
                drafting = []
            while drafting:
                rows = {s.slot: [drafts[s.slot][-1] if drafts[s.slot] else s.last_token] for s in drafting}
                tokens, start, n_new = self.batch_tokens(drafting, rows)
                logits = self.model(tokens, cache, start, n_new, mode=self.draft_mode, logits="last")[:, 0]
                self.counters["draft_forwards"] += 1
                picked = self._pick_drafts(logits, drafting, qprobs)
                still = []
                for s, tok in zip(drafting, picked):
                    drafts[s.slot].append(tok)
                    if len(drafts[s.slot]) < budget[s.slot] and tok not in self._stops(s):
                        still.append(s)
                drafting = still

        # the verify pass re-runs every drafted position from the row's last token
        for s in seqs:
            cache.truncate(s.slot, base[s.slot])
        backup = None if self.kv_overwrite else self._backup(seqs, base, drafts)
        rows = {s.slot: [s.last_token] + drafts[s.slot] for s in seqs}
        with self.timer("verify"):
            tokens, start, n_new = self.batch_tokens(seqs, rows)
            logits = self.model(tokens, cache, start, n_new, mode=self.verify_mode, logits="all")
            self.counters["verify_forwards"] += 1
            results = self._accept(logits, seqs, drafts, qprobs)
        if backup is not None:
            self._restore(backup)

        return results

    def _launch_drafts(self, drafting: list[Sequence], base: dict, budget: dict,
                       tokens: torch.Tensor, sampled: _SampledDrafts | None = None) -> list[torch.Tensor]:
        """Enqueue the draft steps without reading any back: step j + 1 reads step j's tokens on the
        device (the argmax, or for `sampled` rows a draw). tokens: [cache.batch, 1], each drafting row's
        last token. Returns each step's tokens [cache.batch, 1] (on the device). A row keeps drafting after
        a stop token: `_keep_drafts` drops what follows it, and the cache positions are truncated before
        the verify."""
        b = self.cache.batch
        picked = []
        for j in range(max(budget[s.slot] for s in drafting)):
            start, n_new = [0] * b, [0] * b
            for s in drafting:
                if budget[s.slot] > j:
                    start[s.slot], n_new[s.slot] = base[s.slot] + j, 1
            logits = self.model(tokens, self.cache, start, n_new, mode=self.draft_mode, logits="last")[:, 0]
            tokens = logits.argmax(-1, keepdim=True)  # [cache.batch, 1]: the next draft step's input
            if sampled is not None:
                sampled.draw(j, logits, tokens)
            picked.append(tokens)
            self.counters["draft_forwards"] += 1
        return picked

    def _keep_drafts(self, table: list[list[int]], drafting: list[Sequence], budget: dict, drafts: dict) -> None:
        """The drafts the step-by-step loop makes, from every draft step's tokens per slot: up to the
        row's budget, and no further than its first stop token."""
        for s in drafting:
            stops = self._stops(s)
            for tok in table[s.slot][: budget[s.slot]]:
                drafts[s.slot].append(tok)
                if tok in stops:
                    break

    def _draft_chained(self, drafting: list[Sequence], base: dict, budget: dict, drafts: dict) -> None:
        """Greedy drafts without a host round trip per draft, read back once."""
        tokens, _, _ = self.batch_tokens(drafting, {s.slot: [s.last_token] for s in drafting})
        picked = self._launch_drafts(drafting, base, budget, tokens)
        self._keep_drafts(torch.cat(picked, 1).tolist(), drafting, budget, drafts)

    def _cycle_on_device(self, seqs, drafting, base, budget, drafts) -> list[tuple[int, int]]:
        """A cycle with one read back: the drafts (or the ones queued ahead by the cycle before, where
        they fit), then the verify pass fed by the drafts on the device (each row verifying its whole
        budget), then drafts and verify argmaxes read together; with cycle_ahead, the next cycle's
        drafts are queued before that read (all-greedy batches only). A row whose drafts hold a stop
        token verifies positions past it too; acceptance stops at the kept drafts, and the verify
        logits at a position depend on the tokens before it only, so a greedy row's accepted drafts and
        appended token are the step-by-step cycle's. Sampled rows draw their drafts and run the
        acceptance on the device too (`_SampledDrafts`, `accept_rows`): the same rule and
        distribution as the host's, from other draws. draft_s / verify_s are GPU times between the
        phases' boundaries (CUDA events) on the GPU."""
        cache = self.cache
        cuda = cache.k.is_cuda
        event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else (lambda: None)
        t0 = time.perf_counter()
        sampled = [s for s in seqs if not self._greedy(s)]
        rows = _SampledDrafts(sampled, budget) if sampled else None
        ahead, self._ahead = self._ahead, None
        if ahead is not None and rows is None and self._ahead_fits(ahead, seqs, base, budget):
            self.counters["cycles_ahead"] += 1
            g = max((budget[s.slot] for s in drafting), default=0)
            self.counters["discarded_draft_forwards"] += len(ahead.picked) - g
            last, picked, draft_marks = ahead.last, ahead.picked[:g], ahead.events
        else:
            if ahead is not None:
                self.counters["discarded_draft_forwards"] += len(ahead.picked)
            draft_marks = (event(), event())
            if cuda:
                draft_marks[0].record()
            last, _, _ = self.batch_tokens(seqs, {s.slot: [s.last_token] for s in seqs})  # [cache.batch, 1]
            picked = self._launch_drafts(drafting, base, budget, last, rows) if drafting else []
            if cuda:
                draft_marks[1].record()
        t1 = time.perf_counter()
        for s in seqs:
            cache.truncate(s.slot, base[s.slot])
        b = cache.batch
        start, n_new = [0] * b, [0] * b
        for s in seqs:
            start[s.slot], n_new[s.slot] = base[s.slot], 1 + budget[s.slot]
        verify_marks = (event(), event())
        if cuda:
            verify_marks[0].record()
        logits = self.model(torch.cat([last] + picked, 1), cache, start, n_new, mode=self.verify_mode, logits="all")
        self.counters["verify_forwards"] += 1
        top = logits.argmax(-1)  # [cache.batch, 1 + longest budget]
        drawn = [rows.accept(self, logits, picked)] if rows is not None else []  # [cache.batch, 2]
        if cuda:
            verify_marks[1].record()
        g = len(picked)
        state = self._next_state(seqs, base, budget, picked, top) if self.cycle_ahead and rows is None else None
        host, ready = self._stage(torch.cat(picked + [top] + ([state[0].view(-1, 1)] if state else []) + drawn, 1))
        nxt = self._launch_ahead(seqs, base, budget, state) if state else None
        if ready is not None:
            ready.synchronize()  # this cycle's results, not the drafts just queued
        table = host.tolist()  # the cycle's one read back
        self._keep_drafts([row[:g] for row in table], drafting, budget, drafts)
        t2 = time.perf_counter()
        if cuda:
            self.timer.add("draft", draft_marks[0].elapsed_time(draft_marks[1]) / 1e3)
            self.timer.add("verify", verify_marks[0].elapsed_time(verify_marks[1]) / 1e3)
        else:
            self.timer.add("draft", t1 - t0)
            self.timer.add("verify", t2 - t1)
        width = top.shape[1]
        results = [self._accept_greedy(drafts[s.slot], table[s.slot][g:g + width]) if self._greedy(s)
                   else self._kept(rows, s.slot, table[s.slot][-2:], len(drafts[s.slot]), budget[s.slot])
                   for s in seqs]
        if nxt is not None:
            # the next cycle the drafts assumed: the device's accepted count, which must be the host's
            # (it is not where a stop token cut a row's drafts: the drafts are then dropped)
            if all(int(table[s.slot][g + width]) == n for s, (n, _) in zip(seqs, results)):
                nxt.expect = {}
                for s, (n, tok) in zip(seqs, results):
                    after = base[s.slot] + n + 1  # its cache length once n drafts and one token are kept
                    nxt.expect[s.slot] = (after, self._budget(s, len(s.output) + n + 1, after), tok)
                self._ahead = nxt
            else:
                self.counters["discarded_draft_forwards"] += len(nxt.picked)
        return results

    def _next_state(self, seqs, base, budget, picked, top):
        """On the device, from this cycle's drafts and verify argmaxes: each row's accepted count, the
        token it appends, its next base and its next budget ([cache.batch] each; what `_accept_greedy`
        and `_budget` will find on the host, unless a stop token cuts the drafts)."""
        dev, b, g = top.device, self.cache.batch, len(picked)
        bud = [0] * b
        rem = [0] * b  # max_new_tokens - tokens so far
        at = [0] * b
        for s in seqs:
            bud[s.slot], at[s.slot] = budget[s.slot], base[s.slot]
            rem[s.slot] = s.params.max_new_tokens - len(s.output)
        consts = torch.tensor([bud, rem, at], dtype=torch.long).to(dev, non_blocking=True)
        bud_t, rem_t, base_t = consts[0], consts[1], consts[2]
        if g:
            within = torch.arange(g, device=dev).unsqueeze(0) < bud_t.unsqueeze(1)
            match = (torch.cat(picked, 1) == top[:, :g]) & within
            n_acc = match.long().cumprod(1).sum(1)
        else:
            n_acc = torch.zeros(b, dtype=torch.long, device=dev)
        last = top.gather(1, n_acc.unsqueeze(1))  # [cache.batch, 1]
        nbase = base_t + n_acc + 1
        nbud = torch.minimum(torch.minimum(rem_t - n_acc - 2, self.cache.capacity - nbase - 1),
                             torch.full_like(n_acc, self.gamma)).clamp_min(0)
        return n_acc, last, nbase, nbud

    def _launch_ahead(self, seqs, base, budget, state) -> _DraftsAhead | None:
        """Queue the next cycle's greedy drafts at the device-computed positions (`_next_state`), without
        committing any cache length: as many steps as the longest budget any acceptance could leave."""
        _, last, nbase, nbud = state
        # the next budget is largest where no draft is accepted
        steps = max((self._budget(s, len(s.output) + 1, base[s.slot] + 1) for s in seqs), default=0)
        if steps == 0:
            return None
        cuda = last.is_cuda
        marks = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        if cuda:
            marks[0].record()
        reach = max(base[s.slot] + budget[s.slot] + 1 for s in seqs)  # no row's next base is further
        tokens, picked = last, []
        for j in range(steps):
            n_new = (nbud > j).long()
            logits = self.model.forward_at(tokens, (nbase + j).unsqueeze(1), n_new, self.cache, reach + j + 1,
                                           mode=self.draft_mode, logits="last")[:, 0]
            tokens = logits.argmax(-1, keepdim=True)
            picked.append(tokens)
            self.counters["draft_forwards"] += 1
        if cuda:
            marks[1].record()
        return _DraftsAhead({id(s): s.slot for s in seqs}, picked, last, marks, marks[1] if cuda else None)

    def _ahead_fits(self, ahead: _DraftsAhead, seqs, base, budget) -> bool:
        """Whether the drafts queued ahead are this cycle's: the same sequences in the same slots, each
        at the base, budget and last token they assumed."""
        return ahead.covers == {id(s): s.slot for s in seqs} and all(
            ahead.expect.get(s.slot) == (base[s.slot], budget[s.slot], s.last_token) for s in seqs)

    def _discard_ahead(self) -> None:
        if self._ahead is not None:
            self.counters["discarded_draft_forwards"] += len(self._ahead.picked)
            self._ahead = None

    def finish(self) -> None:
        """The generation is over: wait for drafts queued ahead (its wall time includes them) and drop them."""
        if self._ahead is not None and self._ahead.ready is not None:
            self._ahead.ready.synchronize()
        self._discard_ahead()

    @staticmethod
    def _accept_greedy(drafts: list[int], top: list[int]) -> tuple[int, int]:
        """(drafts accepted, token appended) against the verify pass's argmax per position."""
        n = 0
        while n < len(drafts) and drafts[n] == top[n]:
            n += 1
        return n, top[n]

    @staticmethod
    def _kept(rows: _SampledDrafts, slot: int, drawn: list[int], kept: int, budget: int) -> tuple[int, int]:
        """A sampled row's (drafts accepted, token appended) from the device's rule over its whole budget, where
        a stop token kept only the first `kept` drafts: a rejection among those is the rule's over the kept
        drafts; past them, the token follows the accepted stop token, so it is drawn at that position."""
        n, tok = drawn
        if n < kept or kept == budget:
            return n, tok
        return kept, rows.bonus(slot, kept)

    def accept_rows(self, p: torch.Tensor, q: torch.Tensor, d: torch.Tensor, g: list[int],
                    generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """`accept_sampled` for R rows at once, on their device: p [R, G + 1, V] verify probabilities, q [R, G, V]
        draft probabilities (zero past a row's budget g[r]), d [R, G] drafts. Row r accepts d_i while
        u_i q_i(d_i) < p_i(d_i) (u_i ~ U[0, 1): accept with probability min(1, p / q)), then draws from
        max(0, p_n - q_n), which at n = g[r] is p_n itself (the bonus token). Returns (accepted [R], token [R])."""
        r, width, _ = p.shape
        gmax = width - 1
        u = p.new_ones((r, gmax))
        for i, gen in enumerate(generators):
            if g[i]:
                u[i, : g[i]] = torch.rand(g[i], generator=gen, device=gen.device).to(p.device, non_blocking=True)

        def at(i: torch.Tensor) -> torch.Tensor:  # one position per row, as a gather index over [R, T, V]
            return i.view(r, 1, 1).expand(r, 1, p.shape[-1])

        if gmax:
            pd = p[:, :gmax].gather(-1, d.unsqueeze(-1)).squeeze(-1)
            qd = q.gather(-1, d.unsqueeze(-1)).squeeze(-1)
            within = torch.arange(gmax, device=p.device).unsqueeze(0) < device_index(g, p.device).unsqueeze(1)
            n = (within & (u * qd < pd)).long().cumprod(1).sum(1)
            # q past the last draft step is zero (no draft there): gather below it, not from a padded copy of q
            qn = q.gather(1, at(n.clamp(max=gmax - 1))).squeeze(1) * (n < gmax).unsqueeze(1)
        else:
            n = torch.zeros(r, dtype=torch.long, device=p.device)
            qn = torch.zeros_like(p[:, 0])
        pn = p.gather(1, at(n)).squeeze(1)
        resid = (pn - qn).clamp_min(0)
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, pn)  # p == q up to rounding: nothing to correct
        return n, draw_rows(resid, generators)

    def _pick_drafts(self, logits: torch.Tensor, seqs: list[Sequence], qprobs) -> list[int]:
        out = [0] * len(seqs)
        greedy = [i for i, s in enumerate(seqs) if self._greedy(s)]
        if greedy:
            idx = torch.tensor([seqs[i].slot for i in greedy], device=logits.device)
            for i, tok in zip(greedy, logits[idx].argmax(-1).tolist()):
                out[i] = tok
        sampled = [i for i, s in enumerate(seqs) if not self._greedy(s)]
        if sampled:  # filtered on the device, batched; drawn on the host, where the acceptance reads q
            host = filtered_logprobs_rows(logits[[seqs[i].slot for i in sampled]].float(),
                                          [seqs[i].params for i in sampled]).exp().cpu()
            for j, i in enumerate(sampled):
                s = seqs[i]
                q = host[j]
                qprobs[s.slot].append(q)
                out[i] = self._draw(q, s.generator)
        return out

    def _accept(self, logits: torch.Tensor, seqs: list[Sequence], drafts, qprobs) -> list[tuple[int, int]]:
        """(accepted draft count, verify-mode token to append) per sequence."""
        res: list[tuple[int, int]] = [(0, 0)] * len(seqs)
        greedy = [i for i, s in enumerate(seqs) if self._greedy(s)]
        if greedy:
            idx = torch.tensor([seqs[i].slot for i in greedy], device=logits.device)
            top = logits[idx].argmax(-1).tolist()  # [rows, T]
            for i, row in zip(greedy, top):
                res[i] = self._accept_greedy(drafts[seqs[i].slot], row)
        sampled = [i for i, s in enumerate(seqs) if not self._greedy(s)]
        if sampled:  # every verify position filtered on the device at once; the rule runs on the host
            host = filtered_logprobs_rows(logits[[seqs[i].slot for i in sampled]].float(),
                                          [seqs[i].params for i in sampled]).exp().cpu()
            for j, i in enumerate(sampled):
                s = seqs[i]
                g = len(drafts[s.slot])
                res[i] = self.accept_sampled(host[j, : g + 1], qprobs[s.slot], drafts[s.slot], s.generator)
        return res

    def accept_sampled(self, p: torch.Tensor, q: list[torch.Tensor], d: list[int], generator) -> tuple[int, int]:
        """Leviathan et al.'s rule. p: [g+1, V] verify probs; q[i]: [V] draft probs of d[i]."""
        for i, tok in enumerate(d):
            pi, qi = p[i], q[i]
            ratio = float(pi[tok]) / float(qi[tok])  # q_i(d_i) > 0: d_i was drawn from q_i
            if ratio >= 1.0 or self._uniform(generator) < ratio:
                continue
            resid = (pi - qi).clamp_min(0)
            if float(resid.sum()) <= 0:  # p == q up to rounding: nothing to correct
                resid = pi
            return i, self._draw(resid / resid.sum(), generator)
        return len(d), self._draw(p[len(d)], generator)

    # -- the no-overwrite ablation --------------------------------------------------------------
    def _backup(self, seqs, base, drafts):
        """Draft K/V of the positions the verify pass will rewrite (<= gamma per row)."""
        saved = []
        for s in seqs:
            g = len(drafts[s.slot])
            if g:
                lo = base[s.slot]
                saved.append((s.slot, lo, self.cache.k[:, s.slot, :, lo:lo + g].clone(),
                              self.cache.v[:, s.slot, :, lo:lo + g].clone()))
        return saved

    def _restore(self, saved) -> None:
        for slot, lo, k, v in saved:
            g = k.shape[2]
            self.cache.k[:, slot, :, lo:lo + g] = k
            self.cache.v[:, slot, :, lo:lo + g] = v

    # -- statistics -----------------------------------------------------------------------------
    def stats(self) -> dict:
        out = super().stats()
        c = self.counters
        out.update({
            "draft_mode": self.draft_mode, "verify_mode": self.verify_mode, "gamma": self.gamma,
            "kv_overwrite": self.kv_overwrite, "acceptance": self.acceptance,
            # accepted / drafted drafts
            "acceptance_rate": round(c["accepted"] / c["drafted"], 4) if c["drafted"] else None,
            # tokens a sequence gains per cycle: accepted drafts + the verify-mode correction/bonus
            "mean_accepted_length": round(c["emitted"] / c["seq_cycles"], 4) if c["seq_cycles"] else None,
        })
        t = self.timer.totals
        if c["emitted"]:  # the paper's Figure 4: per-token latency split into draft and verify
            out["draft_s_per_token"] = round(t.get("draft", 0.0) / c["emitted"], 9)
            out["verify_s_per_token"] = round(t.get("verify", 0.0) / c["emitted"], 9)
        out.setdefault("draft_s", 0.0)
        out.setdefault("verify_s", 0.0)
        return out
