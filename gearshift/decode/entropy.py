"""GEARBX entropy routing: the per-token gear decision (paper sections 3, 4, 10, 11, 16).

Everything here is model-independent (imports only torch / math / stdlib): it reads logits and
returns gear names; the precision manager and the decode loop act on them.

Gears (paper table 8): ``"low"`` = int4 weights, ``"mid"`` = int8, ``"high"`` = the original
weights (lossless).

Per decode step of a batch the loop does::

    logits = sanitize_logits(logits)                 # gumbel.py, the paper's NaN guard
    monitor.dispatch(logits)                         # entropy [B] stays on the device, no sync
    next_ids = sample(logits, ...)                   # still on the device
    ids, decisions = monitor.fetch(next_ids)         # ONE device->host copy: ids + entropies
    # decisions[i].gear: gear for sequence i's next forward; .shifted: swap now;
    # .predicted_gear: pre-warm target (slope prediction)

(``commit(host_entropies)`` is the same update for a loop that does its own single transfer.)

Rules, per sequence, in the order one commit applies them (paper constants in ``DEFAULTS``):

1. the raw entropy ``H_t`` (bits) enters a rolling window of the last ``window`` values; the
   smoothed entropy is the window mean ``H̄_t`` (fewer values at the start: mean of those held);
2. the token counts toward the current gear: ``tokens_in_gear += 1``;
3. the *desired* gear classifies ``H̄_t`` with thresholds (θ_low, θ_high) and hysteresis:
   low if ``H̄ <= θ_low``, high if ``H̄ >= θ_high``, mid otherwise, except that a sequence in an
   extreme gear leaves it only by crossing that gear's threshold by the margin ``h``: in low it
   stays low while ``H̄ <= θ_low + h`` (leaves on ``H̄ > θ_low + h``), in high it stays high while
   ``H̄ >= θ_high - h`` (leaves on ``H̄ < θ_high - h``).  Mid has no margin (the paper puts
   hysteresis on the extreme gears only).  h is in bits and is *not* vocabulary-scaled (the
   paper scales only the thresholds);
4. catastrophic fallback: if the last ``catastrophic_count`` = 2 raw entropies all exceed
   ``0.9 log2 V``, the desired gear is high;
5. the gear changes to the desired one only if ``tokens_in_gear >= min_gear_duration`` (the
   gear has served that many forward passes); a catastrophic fallback ignores the duration
   (``catastrophic_overrides_duration``, see below).  A shift resets ``tokens_in_gear`` to 0;
6. slope prediction for pre-warming: ``∇H = (H_last - H_first)/(|W| - 1)`` over the window
   (0 with fewer than two values), ``Ĥ_{t+L} = H̄_t + L ∇H`` with L = 2, and the predicted gear
   classifies Ĥ from the (new) current gear with the same hysteresis.  It never shifts; it
   names the gear whose modules are worth preparing.

Choices where the paper is silent or ambiguous (each is a constructor argument):

* ``min_gear_duration = 8``.  Table 16.1 gives no default; section 9 says "typical gear runs of
  8-30 tokens are long enough to amortize" the shift cost, so 8 is the shortest run the paper
  calls amortized.  It also exceeds the window (5), so one shift's window has mostly been
  refilled with tokens of the new gear before the next shift is judged, and it yields the
  contiguous same-precision KV blocks of section 13.2.
* Catastrophic fallback overrides the minimum duration.  Listing 2 tests "duration met" after
  setting gear = high, but section 18.2 presents the fallback as a safety guarantee; two
  near-uniform distributions in a row mean the low-precision model is producing noise, and
  waiting up to 8 more tokens in int4 would defeat the guarantee.  Pass
  ``catastrophic_overrides_duration=False`` for the listing's behaviour.
* The monitor records every committed token's entropy (section 3.2's window is the last w
  tokens).  Listing 2 skips the entropy while ``tokens_in_gear < min_gear_duration - 1`` to save
  its O(V) cost; :meth:`EntropyMonitor.needs_entropy` tells a loop when it may skip, at the
  price of a window that then holds the last w *observed* values.
* A non-finite committed entropy (only possible if the logits were not sanitized) is treated
  as ``log2 V`` (maximal uncertainty): the safe direction.
* Initial gear when nothing else is known: high (lossless).  The loop normally starts each
  sequence in the :class:`PromptClassifier` gear via ``reset(seq, gear=...)``.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

GEARS: tuple[str, ...] = ("low", "mid", "high")
#: precision order, for the max over a batch
GEAR_RANK: dict[str, int] = {g: i for i, g in enumerate(GEARS)}
#: weight bits each gear reads (paper table 8; 16 = the original weights)
GEAR_BITS: dict[str, int] = {"low": 4, "mid": 8, "high": 16}

# ---- paper constants (section 16 and the sections cited) ----
#: rolling window, PyTorch backend (3.2, table 9)
WINDOW = 5
#: thresholds in bits for the reference vocabulary (1.3 table 1, 3.3, table 9)
THETA_LOW_REF = 1.8
THETA_HIGH_REF = 3.5
#: reference vocabulary for threshold scaling (3.4, table 9)
V_REF = 32768
#: hysteresis exit margin in bits (3.3, table 9)
HYSTERESIS = 0.1
#: slope-prediction horizon L (3.5)
PREDICT_HORIZON = 2
#: catastrophic fallback: the last 2 entropies above 0.9 log2 V (3.5)
CATASTROPHIC_FRACTION = 0.9
CATASTROPHIC_COUNT = 2
#: calibration (4.1, 4.2, table 10)
CAL_P_LOW = 0.30
CAL_P_HIGH = 0.60
CAL_MIN_SAMPLES = 5
CAL_LOW_FLOOR = 0.01
CAL_MIN_BAND = 0.2
CAL_CAP_LOW = 0.06
CAL_CAP_HIGH = 0.12
#: manual calibration utility (4.2)
MANUAL_EASY_PCT = 0.80
MANUAL_HARD_PCT = 0.20
# ---- choices (see the module docstring) ----
#: tokens a gear serves before another shift (paper section 9: runs of 8-30 tokens amortize a shift)
MIN_GEAR_DURATION = 8
INITIAL_GEAR = "high"

_LN2 = math.log(2.0)


def _check_gear(gear: str) -> str:
    if gear not in GEAR_RANK:
        raise ValueError(f"unknown gear {gear!r} (gears: {', '.join(GEARS)})")
    return gear


def max_gear(gears: Iterable[str]) -> str:
    """The most precise of ``gears`` ("low" if empty): the safe single gear for a shared forward."""
    best = "low"
    for g in gears:
        if GEAR_RANK[_check_gear(g)] > GEAR_RANK[best]:
            best = g
    return best


# ----------------------------------------------------------------------------------------------
# entropy
# ----------------------------------------------------------------------------------------------

def entropy_bits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in bits of softmax(logits) over the last dim: [..., V] -> [...] fp32.

    Paper 3.1: ``l = log_softmax(z)``, ``p = exp(l)``, ``H = -(p . l) / ln 2`` (computed in fp32
    whatever the logits' dtype).  Entries with logit -inf (masked / padded vocabulary) have
    p = 0 and contribute 0 (their ``l`` is clamped to a finite value so 0 * -inf cannot make a
    NaN).  The result is clamped at 0 against rounding.  Runs on the logits' device, no sync."""
    ell = torch.log_softmax(logits.float(), dim=-1)
    p = ell.exp()
    h = -(p * ell.clamp_min(torch.finfo(torch.float32).min)).sum(-1) / _LN2
    return h.clamp_min(0.0)


def max_entropy_bits(vocab_size: int) -> float:
    """``log2 V``: the entropy of the uniform distribution, the upper bound of H (3.1)."""
    return math.log2(int(vocab_size))


def vocab_scale(vocab_size: int, v_ref: int = V_REF) -> float:
    """``log2 V / log2 V_ref`` (3.4)."""
    return math.log2(int(vocab_size)) / math.log2(int(v_ref))


def scaled_thresholds(vocab_size: int, theta_low: float = THETA_LOW_REF, theta_high: float = THETA_HIGH_REF,
                      v_ref: int = V_REF) -> tuple[float, float]:
    """Default thresholds for a vocabulary of ``vocab_size`` (3.4): reference values times the scale.

    e.g. V = 49152: scale = 15.585/15 = 1.0390 -> (1.870, 3.637);
    V = 128256: scale = 16.969/15 = 1.1313 -> (2.036, 3.959)."""
    s = vocab_scale(vocab_size, v_ref)
    return theta_low * s, theta_high * s


def classify_gear(mean_entropy: float, theta_low: float, theta_high: float, current: str | None = None,
                  hysteresis: float = HYSTERESIS) -> str:
    """Gear for a smoothed entropy (3.3), with the exit margin of the current extreme gear.

    Without a current gear (or from mid): low if ``H <= θ_low``, high if ``H >= θ_high``, else mid.
    From low: the low threshold becomes ``θ_low + h`` (leaving low needs ``H > θ_low + h``).
    From high: the high threshold becomes ``θ_high - h`` (leaving high needs ``H < θ_high - h``)."""
    lo, hi = theta_low, theta_high
    if current == "low":
        lo = theta_low + hysteresis
    elif current == "high":
        hi = theta_high - hysteresis
    if mean_entropy <= lo:
        return "low"
    if mean_entropy >= hi:
        return "high"
    return "mid"


# ----------------------------------------------------------------------------------------------
# calibration
# ----------------------------------------------------------------------------------------------

def _expand_band(lo: float, hi: float, min_band: float, low_floor: float) -> tuple[float, float]:
    """Widen (lo, hi) to ``min_band`` symmetrically about its centre.

    If that would put lo below ``low_floor`` (only when the centre is within min_band/2 of it,
    i.e. every sample is below ~0.1 bit), the band is instead placed at
    [low_floor, low_floor + min_band]: a negative low threshold would disable the low gear,
    which is the opposite of what near-zero entropies ask for, and keeping the full width keeps
    the band's anti-oscillation purpose."""
    if hi - lo >= min_band:
        return lo, hi
    centre = 0.5 * (lo + hi)
    lo, hi = centre - 0.5 * min_band, centre + 0.5 * min_band
    if lo < low_floor:
        lo, hi = low_floor, low_floor + min_band
    return lo, hi


def _floor_index(n: int, p: float) -> int:
    # floor(n * p) as in exact arithmetic: 1e-9 absorbs binary rounding of products like
    # n * 0.3 that should be integers (our reading of the paper's formula is mathematical).
    return math.floor(n * p + 1e-9)


def calibrate_thresholds(entropies: Iterable[float], vocab_size: int, *, p_low: float = CAL_P_LOW,
                         p_high: float = CAL_P_HIGH, min_samples: int = CAL_MIN_SAMPLES,
                         low_floor: float = CAL_LOW_FLOOR, min_band: float = CAL_MIN_BAND,
                         cap_low: float = CAL_CAP_LOW, cap_high: float = CAL_CAP_HIGH
                         ) -> tuple[float, float] | None:
    """Percentile calibration from prefill entropies (paper 4.1 + PyTorch caps of 4.2).

    With ``e`` the sorted strictly positive finite samples, ``n = len(e)``, 0-based indexing
    exactly as the paper writes it::

        θ_low  = max(e[floor(n * 0.30) - 1], 0.01)
        θ_high = e[min(n - 1, floor(n * 0.60))]

    (n = 5: e[0] and e[3]; n = 10: e[2] and e[6]; n = 20: e[5] and e[12]).  Then a band
    narrower than 0.2 bits is widened symmetrically about its centre (:func:`_expand_band`),
    then the caps ``θ_low <= 0.06 log2 V`` and ``θ_high <= 0.12 log2 V`` apply (for V = 32768:
    0.9 and 1.8 bits).  The result is in bits of the actual vocabulary; it is not scaled
    again.  Returns None when fewer than 5 samples remain: the caller keeps its defaults."""
    e = sorted(float(x) for x in entropies if math.isfinite(float(x)) and float(x) > 0.0)
    n = len(e)
    if n < max(min_samples, 1):
        return None
    lo = max(e[max(_floor_index(n, p_low) - 1, 0)], low_floor)
    hi = e[min(n - 1, _floor_index(n, p_high))]
    lo, hi = _expand_band(lo, hi, min_band, low_floor)
    hmax = max_entropy_bits(vocab_size)
    return min(lo, cap_low * hmax), min(hi, cap_high * hmax)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) with linear interpolation between order statistics
    (numpy's default "linear" method: position ``q * (n - 1)`` in the sorted values)."""
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("percentile of an empty list")
    pos = q * (len(v) - 1)
    i = math.floor(pos)
    j = min(i + 1, len(v) - 1)
    return v[i] + (pos - i) * (v[j] - v[i])


def manual_thresholds(easy_entropies: Sequence[float], hard_entropies: Sequence[float], *,
                      easy_pct: float = MANUAL_EASY_PCT, hard_pct: float = MANUAL_HARD_PCT,
                      min_band: float = CAL_MIN_BAND, low_floor: float = CAL_LOW_FLOOR) -> tuple[float, float]:
    """The manual utility of paper 4.2: thresholds from entropies of easy and of hard prompts.

    ``a`` = 80th percentile of the easy-prompt entropies (80 % of easy tokens lie at or below
    it), ``b`` = 20th percentile of the hard-prompt entropies (80 % of hard tokens at or above
    it).  Returns ``(θ_low, θ_high) = (min(a, b), max(a, b))``: when the two populations are
    separated (a < b), easy tokens route low and hard tokens high with the gap as mid; when
    they overlap (a > b) the overlap itself becomes the mid band, so ambiguous tokens get
    int8 rather than a coin flip between int4 and fp16.  A band narrower than ``min_band``
    (0.2 bits, as in 4.1) is widened about its centre.  No vocabulary caps: the user chose the
    prompts.  Percentiles interpolate linearly (:func:`percentile`)."""
    a = percentile(easy_entropies, easy_pct)
    b = percentile(hard_entropies, hard_pct)
    return _expand_band(min(a, b), max(a, b), min_band, low_floor)


# ----------------------------------------------------------------------------------------------
# the monitor
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GearDecision:
    """What one commit decided for one sequence.

    ``gear`` is the gear of that sequence's next forward pass; ``shifted`` says it differs from
    ``previous_gear`` (the precision manager swaps now).  ``desired_gear`` is what the entropy
    asked for before the minimum-duration rule (equal to ``gear`` unless the shift is being held
    back).  ``predicted_gear`` is the slope prediction: the gear worth pre-warming."""

    gear: str
    previous_gear: str
    shifted: bool
    desired_gear: str
    entropy: float
    mean_entropy: float
    predicted_entropy: float
    predicted_gear: str
    catastrophic: bool
    tokens_in_gear: int


@dataclass
class SequenceState:
    """Everything the monitor knows about one sequence (one row of the batch)."""

    gear: str
    theta_low: float
    theta_high: float
    window: deque
    recent: deque
    calibrated: bool = False
    tokens_in_gear: int = 0
    shifts: int = 0
    tokens_per_gear: dict = field(default_factory=lambda: {g: 0 for g in GEARS})


def _pad_rows(values: torch.Tensor, rows: int) -> torch.Tensor:
    """`values` [W] padded with zeros to [rows] (a narrow step's rows, in a monitor of every slot)."""
    w = values.shape[0]
    return values if w == rows else torch.cat((values, values.new_zeros(rows - w)))


class EntropyMonitor:
    """Per-sequence entropy routing for a batch (paper 3, 4, 10; rules in the module docstring).

    One monitor serves one model (one vocabulary size ``vocab_size``, the *real* vocabulary,
    not a padded logits width) and a batch whose rows are sequences.  Each row has its own
    window, gear, duration counter and calibration, so sequences of a continuous batch never
    influence each other.  Rows are addressed by index; :meth:`reset` reuses a row for a new
    request, :meth:`add_sequence` / :meth:`keep` follow a batch that grows or is compacted.

    Deferred entropy (3.6): :meth:`dispatch` only launches the O(V) entropy kernel and keeps
    its [B] result on the device; the values are read together with the sampled token ids in
    the step's one device->host copy (:meth:`fetch`), or handed in by a loop that made that
    copy itself (:meth:`commit`).  No method but :meth:`fetch`, :meth:`commit` without values
    and :meth:`calibrate_from_logits` synchronises."""

    def __init__(self, vocab_size: int, batch_size: int = 1, *, window: int = WINDOW,
                 theta_low: float = THETA_LOW_REF, theta_high: float = THETA_HIGH_REF, v_ref: int = V_REF,
                 hysteresis: float = HYSTERESIS, min_gear_duration: int = MIN_GEAR_DURATION,
                 predict_horizon: int = PREDICT_HORIZON, catastrophic_fraction: float = CATASTROPHIC_FRACTION,
                 catastrophic_count: int = CATASTROPHIC_COUNT, catastrophic_overrides_duration: bool = True,
                 initial_gear: str = INITIAL_GEAR):
        if vocab_size < 2:
            raise ValueError("vocab_size must be at least 2")
        if window < 1 or min_gear_duration < 0 or catastrophic_count < 1:
            raise ValueError("window and catastrophic_count must be >= 1, min_gear_duration >= 0")
        self.vocab_size = int(vocab_size)
        self.window = int(window)
        self.hysteresis = float(hysteresis)
        self.min_gear_duration = int(min_gear_duration)
        self.predict_horizon = int(predict_horizon)
        self.catastrophic_count = int(catastrophic_count)
        self.catastrophic_overrides_duration = bool(catastrophic_overrides_duration)
        self.initial_gear = _check_gear(initial_gear)
        self.max_entropy = max_entropy_bits(vocab_size)
        #: raw entropy above which a token counts as catastrophic: 0.9 log2 V
        self.catastrophic_threshold = catastrophic_fraction * self.max_entropy
        #: vocabulary-scaled default thresholds (used until a sequence is calibrated)
        self.default_thresholds = scaled_thresholds(vocab_size, theta_low, theta_high, v_ref)
        self._states: list[SequenceState] = [self._new_state(self.initial_gear) for _ in range(int(batch_size))]
        self._pending: torch.Tensor | None = None

    # ---- batch bookkeeping ------------------------------------------------------------------
    def _new_state(self, gear: str) -> SequenceState:
        lo, hi = self.default_thresholds
        return SequenceState(gear=_check_gear(gear), theta_low=lo, theta_high=hi,
                             window=deque(maxlen=self.window), recent=deque(maxlen=self.catastrophic_count))

    @property
    def batch_size(self) -> int:
        return len(self._states)

    def state(self, seq: int) -> SequenceState:
        """The live state of row ``seq`` (read it; change it through the methods)."""
        return self._states[seq]

    @property
    def gears(self) -> list[str]:
        """Current gear of every row."""
        return [s.gear for s in self._states]

    def gear(self, seq: int = 0) -> str:
        return self._states[seq].gear

    def batch_gear(self, active: Sequence[bool] | None = None) -> str:
        """The most precise gear any active row is in: the one gear a shared forward can use
        without giving any sequence less precision than its monitor chose."""
        return max_gear(s.gear for i, s in enumerate(self._states) if active is None or active[i])

    def thresholds(self, seq: int = 0) -> tuple[float, float]:
        """(θ_low, θ_high) of row ``seq``: calibrated, else the vocabulary-scaled defaults."""
        s = self._states[seq]
        return s.theta_low, s.theta_high

    def reset(self, seq: int | None = None, *, gear: str | None = None, keep_calibration: bool = True) -> None:
        """Start row ``seq`` (all rows if None) afresh for a new prompt in ``gear``.

        Window, counters and catastrophic history are cleared.  Calibration is kept by default
        (Listing 2: "reset monitor, preserving calibration"; 18.2: calibration is set once per
        session); pass ``keep_calibration=False`` when the row now serves an unrelated request
        that will be calibrated from its own prefill."""
        rows = range(self.batch_size) if seq is None else [seq]
        for i in rows:
            old = self._states[i]
            new = self._new_state(gear or self.initial_gear)
            if keep_calibration and old.calibrated:
                new.theta_low, new.theta_high, new.calibrated = old.theta_low, old.theta_high, True
            self._states[i] = new
        # a pending entropy stays valid (the batch shape is unchanged); commit it with
        # active[i] = False for a row reset in between, or it is applied to the fresh row

    def add_sequence(self, gear: str | None = None) -> int:
        """Append a row (a new request joining the batch); returns its index."""
        self._states.append(self._new_state(gear or self.initial_gear))
        self._pending = None
        return len(self._states) - 1

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only these rows, in this order (the batch was compacted or reordered)."""
        self._states = [self._states[i] for i in indices]
        self._pending = None

    def set_gear(self, seq: int, gear: str) -> None:
        """Force row ``seq`` into ``gear`` (e.g. the prompt classifier's cold-start gear).

        Counts as a shift for the duration rule: ``tokens_in_gear`` restarts at 0."""
        s = self._states[seq]
        if _check_gear(gear) != s.gear:
            s.gear, s.tokens_in_gear = gear, 0
            s.shifts += 1

    # ---- calibration ------------------------------------------------------------------------
    def calibrate(self, seq: int, entropies: Iterable[float]) -> bool:
        """Set row ``seq``'s thresholds by percentile calibration (:func:`calibrate_thresholds`).

        Returns False (defaults kept) when fewer than 5 positive samples exist."""
        th = calibrate_thresholds(entropies, self.vocab_size)
        if th is None:
            return False
        s = self._states[seq]
        s.theta_low, s.theta_high = th
        s.calibrated = True
        return True

    def calibrate_from_logits(self, seq: int, prefill_logits: torch.Tensor) -> bool:
        """Calibrate row ``seq`` from its prefill logits [T, V] (one entropy per prompt
        position).  Synchronises once; it runs once per request, not per token."""
        return self.calibrate(seq, entropy_bits(prefill_logits.reshape(-1, prefill_logits.shape[-1])).tolist())

    def uncalibrate(self, seq: int) -> None:
        s = self._states[seq]
        s.theta_low, s.theta_high = self.default_thresholds
        s.calibrated = False

    # ---- per-step: deferred entropy ---------------------------------------------------------
    def needs_entropy(self, active: Sequence[bool] | None = None) -> bool:
        """Whether any active row could shift after this step (Listing 2's
        ``tokens_in_gear >= min_gear_duration - 1``).  A loop may skip :meth:`dispatch` and
        commit ``None`` entries when this is False, trading window freshness for O(V) work."""
        return any(s.tokens_in_gear >= self.min_gear_duration - 1
                   for i, s in enumerate(self._states) if active is None or active[i])

    def dispatch(self, logits: torch.Tensor) -> torch.Tensor:
        """Launch the entropy of this step's logits [B, V] (or [B, 1, V]); keep it pending.

        Returns the fp32 [B] device tensor without synchronising.  The logits may hold the first
        W <= B rows only (a decode step over the first slots, `DecodePolicy.decode_width`): rows from
        W on then read entropy 0, for rows that must be inactive.  Sanitize the logits first
        (gumbel.sanitize_logits)."""
        if logits.dim() == 3:
            logits = logits[:, -1, :]
        if logits.shape[0] > self.batch_size:
            raise ValueError(f"logits batch {logits.shape[0]} > monitor batch {self.batch_size}")
        self._pending = _pad_rows(entropy_bits(logits), self.batch_size)
        return self._pending

    def fetch(self, token_ids: torch.Tensor, active: Sequence[bool] | None = None
              ) -> tuple[list[int], list[GearDecision | None]]:
        """The step's single device->host copy: sampled ids [B] and the pending entropies.

        Both are stacked into one fp64 [2, B] tensor (token ids are exact in fp64 up to 2**53)
        and read with one ``.tolist()``; the entropies are then committed.  Returns the token
        ids as Python ints and :meth:`commit`'s decisions."""
        host_ids, host_h = self.staged(token_ids).tolist()
        return [int(i) for i in host_ids], self.commit(host_h, active)

    def staged(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The fp64 [2, B] device tensor :meth:`fetch` reads (ids, pending entropies), for a loop that
        copies it to the host itself (asynchronously, to launch more work first) and then calls
        :meth:`commit` with its second row. Ids of the first W <= B rows are padded with 0."""
        if self._pending is None:
            raise RuntimeError("fetch() without a dispatch()ed entropy")
        ids = token_ids.reshape(-1)
        if ids.numel() > self.batch_size:
            raise ValueError(f"{ids.numel()} token ids for a batch of {self.batch_size}")
        return torch.stack((_pad_rows(ids, self.batch_size).to(torch.float64), self._pending.to(torch.float64)))

    def commit(self, host_entropies: Sequence[float | None] | None = None,
               active: Sequence[bool] | None = None) -> list[GearDecision | None]:
        """Apply one step's entropies (host floats, one per row) and decide each row's gear.

        ``host_entropies=None`` reads the pending device tensor (one sync: use it only where
        the loop has synchronised anyway).  Rows with ``active[i]`` False (finished, still in
        prefill, padding) or a ``None`` entropy are left untouched and get ``None``.  Each
        committed row is one forward pass done in its current gear."""
        if host_entropies is None:
            if self._pending is None:
                raise RuntimeError("commit() without values and without a dispatch()ed entropy")
            host_entropies = self._pending.tolist()
        self._pending = None
        if len(host_entropies) != self.batch_size:
            raise ValueError(f"{len(host_entropies)} entropies for a batch of {self.batch_size}")
        out: list[GearDecision | None] = []
        for i, h in enumerate(host_entropies):
            if h is None or (active is not None and not active[i]):
                out.append(None)
            else:
                out.append(self._update(self._states[i], float(h)))
        return out

    def observe(self, seq: int, entropy: float) -> GearDecision:
        """Commit one entropy for one row (tests, single-sequence loops, telemetry replay)."""
        return self._update(self._states[seq], float(entropy))

    # ---- the rules --------------------------------------------------------------------------
    @staticmethod
    def smoothed(state: SequenceState) -> float:
        """Window mean H̄ (3.2); 0 for an empty window."""
        return sum(state.window) / len(state.window) if state.window else 0.0

    @staticmethod
    def slope(state: SequenceState) -> float:
        """∇H = (H_last - H_first) / (|W| - 1) over the window (3.5); 0 below two values."""
        w = state.window
        return (w[-1] - w[0]) / (len(w) - 1) if len(w) >= 2 else 0.0

    def predict(self, seq: int) -> tuple[float, str]:
        """(Ĥ_{t+L}, gear Ĥ would select from the current gear) for row ``seq`` (3.5)."""
        return self._predict(self._states[seq])

    def _predict(self, s: SequenceState) -> tuple[float, str]:
        h_hat = self.smoothed(s) + self.predict_horizon * self.slope(s)
        return h_hat, classify_gear(h_hat, s.theta_low, s.theta_high, s.gear, self.hysteresis)

    def _update(self, s: SequenceState, h: float) -> GearDecision:
        if not math.isfinite(h):
            h = self.max_entropy
        s.window.append(h)
        s.recent.append(h)
        s.tokens_per_gear[s.gear] += 1
        s.tokens_in_gear += 1
        mean = self.smoothed(s)
        desired = classify_gear(mean, s.theta_low, s.theta_high, s.gear, self.hysteresis)
        catastrophic = (len(s.recent) == self.catastrophic_count
                        and all(x > self.catastrophic_threshold for x in s.recent))
        if catastrophic:
            desired = "high"
        previous = s.gear
        may_shift = (s.tokens_in_gear >= self.min_gear_duration
                     or (catastrophic and self.catastrophic_overrides_duration))
        shifted = desired != previous and may_shift
        if shifted:
            s.gear, s.tokens_in_gear = desired, 0
            s.shifts += 1
        h_hat, predicted = self._predict(s)
        return GearDecision(gear=s.gear, previous_gear=previous, shifted=shifted, desired_gear=desired, entropy=h,
                            mean_entropy=mean, predicted_entropy=h_hat, predicted_gear=predicted,
                            catastrophic=catastrophic, tokens_in_gear=s.tokens_in_gear)


# ----------------------------------------------------------------------------------------------
# cold-start prompt classifier (paper section 11)
# ----------------------------------------------------------------------------------------------

#: characters counted as mathematical symbols (each occurrence counts once)
MATH_SYMBOLS = frozenset("+=*/^<>%×÷±√∑∏∫∂∇∞≤≥≠≈∈∉⊂⊆∪∩∀∃πθλσμΔ")
# '-' counts as a minus sign unless it is a hyphen between two letters ("well-known")
_MINUS = re.compile(r"(?<![^\W\d_])-|-(?![^\W\d_])")
#: programming keywords (whole lower-cased words)
CODE_KEYWORDS = frozenset("""
def class function return import lambda const var struct void int float printf println console async await
elif enum namespace typedef sql python javascript typescript java rust golang bash code coding program
programming algorithm compile compiler debug bug recursion recursive regex api json array loop variable
script implement
""".split())
#: reasoning keywords (whole lower-cased words); the paper counts both lists together as n_code
REASONING_KEYWORDS = frozenset("""
prove proof derive derivation theorem lemma calculate compute solve equation integral derivative
probability logic reasoning why step therefore hence deduce infer evaluate optimize complexity
""".split())
_WORD = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class PromptFeatures:
    n_math: int
    n_code: int
    n_words: int
    mean_word_length: float
    score: float
    gear: str


class PromptClassifier:
    """Cold-start gear from the prompt text (paper 11), before any entropy exists.

    ``score = 2 n_math + 1.5 n_code + 0.3 min(|W| / 50, 3) + 1.5 * 1[mean word length > 6.5]``
    (the paper prints the last term as "1.51[...]"; we read it as 1.5 times the indicator
    1[.], matching the 1.5 weight of n_code and the 1.5 mid threshold).  score >= 4.0 -> high,
    >= 1.5 -> mid, else low.

    * n_math: occurrences of :data:`MATH_SYMBOLS` characters, plus '-' when it is not a hyphen
      between two letters.
    * n_code: occurrences of whole words (lower-cased ``[a-z_][a-z0-9_]*`` runs) in
      :data:`CODE_KEYWORDS` or :data:`REASONING_KEYWORDS`.
    * |W|: whitespace-separated words; mean word length: their mean character count,
      punctuation included (0 for an empty prompt).
    """

    def __init__(self, high: float = 4.0, mid: float = 1.5, math_symbols=MATH_SYMBOLS,
                 keywords=CODE_KEYWORDS | REASONING_KEYWORDS):
        self.high, self.mid = float(high), float(mid)
        self.math_symbols = frozenset(math_symbols)
        self.keywords = frozenset(keywords)

    def features(self, prompt: str) -> PromptFeatures:
        n_math = sum(1 for c in prompt if c in self.math_symbols) + len(_MINUS.findall(prompt))
        n_code = sum(1 for w in _WORD.findall(prompt.lower()) if w in self.keywords)
        words = prompt.split()
        n_words = len(words)
        mean_len = sum(len(w) for w in words) / n_words if n_words else 0.0
        long_words = 1.0 if mean_len > 6.5 else 0.0
        score = 2.0 * n_math + 1.5 * n_code + 0.3 * min(n_words / 50.0, 3.0) + 1.5 * long_words
        gear = "high" if score >= self.high else "mid" if score >= self.mid else "low"
        return PromptFeatures(n_math, n_code, n_words, mean_len, score, gear)

    def score(self, prompt: str) -> float:
        return self.features(prompt).score

    def classify(self, prompt: str) -> str:
        return self.features(prompt).gear

    __call__ = classify
