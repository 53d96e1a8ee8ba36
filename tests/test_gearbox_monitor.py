"""GEARBX entropy monitor, calibration, prompt classifier and sampling helpers.

Every expectation below is hand-computed from the paper's rules (sections 3, 4, 10, 11, 16)."""

import math

import pytest
import torch

from gearshift.decode.entropy import (CAL_MIN_BAND, HYSTERESIS, MIN_GEAR_DURATION, THETA_HIGH_REF, THETA_LOW_REF,
                                      V_REF, WINDOW, EntropyMonitor, PromptClassifier, calibrate_thresholds,
                                      classify_gear, entropy_bits, manual_thresholds, max_gear, percentile,
                                      scaled_thresholds)
from gearshift.decode.gumbel import (GUMBEL_FLOOR, gumbel_max_sample, gumbel_noise, min_p_filter, sample,
                                     sanitize_logits)

V = 32768  # log2 V = 15: thresholds unscaled, catastrophic above 13.5 bits


def mon(**kw):
    kw.setdefault("min_gear_duration", 1)
    kw.setdefault("window", 1)
    return EntropyMonitor(kw.pop("vocab_size", V), kw.pop("batch_size", 1), **kw)


def feed(m, values, seq=0):
    return [m.observe(seq, h) for h in values]


# ---- constants ------------------------------------------------------------------------------

def test_paper_constants():
    assert (WINDOW, THETA_LOW_REF, THETA_HIGH_REF, HYSTERESIS, V_REF, CAL_MIN_BAND) == (5, 1.8, 3.5, 0.1, 32768, 0.2)
    assert MIN_GEAR_DURATION == 8
    m = EntropyMonitor(V)
    assert m.window == 5 and m.min_gear_duration == 8 and m.predict_horizon == 2 and m.hysteresis == 0.1
    assert m.thresholds(0) == (1.8, 3.5)
    assert m.catastrophic_threshold == pytest.approx(13.5)


# ---- entropy of known distributions ---------------------------------------------------------

@pytest.mark.parametrize("v", [2, 7, 1000, 32768])
def test_uniform_entropy_is_log2_v(v):
    assert float(entropy_bits(torch.zeros(v))) == pytest.approx(math.log2(v), abs=1e-4)


def test_known_entropies_batched():
    ninf = float("-inf")
    logits = torch.tensor([
        [0.0, ninf, ninf, ninf],                           # one-hot: 0
        [0.0, 0.0, ninf, ninf],                            # fair coin: 1 bit
        [math.log(0.25), math.log(0.75), ninf, ninf],      # Bernoulli(1/4): 0.811278 bits
        [0.0, 0.0, 0.0, 0.0],                              # uniform over 4: 2 bits
        [100.0, 0.0, 0.0, 0.0],                            # near one-hot: ~0
    ])
    h = entropy_bits(logits)
    assert h.shape == (5,) and h.dtype == torch.float32
    expect = [0.0, 1.0, -(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75)), 2.0, 0.0]
    assert h.tolist() == pytest.approx(expect, abs=1e-5)
    # bf16 logits and [B, 1, V] shapes
    assert entropy_bits(torch.zeros(3, 1, 8, dtype=torch.bfloat16)).flatten().tolist() == pytest.approx([3.0] * 3)


# ---- thresholds: vocabulary scaling -----------------------------------------------------------

def test_threshold_scaling_49152():
    # log2(49152) = 14 + log2(3) = 15.58496; scale = 1.038998
    lo, hi = scaled_thresholds(49152)
    assert lo == pytest.approx(1.8 * 15.5849625 / 15, abs=1e-6) == pytest.approx(1.870196, abs=1e-6)
    assert hi == pytest.approx(3.636491, abs=1e-6)
    assert EntropyMonitor(49152).thresholds() == (lo, hi)


def test_threshold_scaling_128256():
    # log2(128256) = 16.968667; scale = 1.131244
    lo, hi = scaled_thresholds(128256)
    assert lo == pytest.approx(2.036240, abs=1e-6)
    assert hi == pytest.approx(3.959356, abs=1e-6)
    assert EntropyMonitor(128256).catastrophic_threshold == pytest.approx(0.9 * 16.968667, abs=1e-5)


# ---- window mean ------------------------------------------------------------------------------

def test_window_mean():
    m = mon(window=5, min_gear_duration=100)
    d = feed(m, [1.0, 2.0, 3.0])
    assert [x.mean_entropy for x in d] == pytest.approx([1.0, 1.5, 2.0])  # partial window: mean of held
    d = feed(m, [4.0, 5.0, 6.0])
    assert [x.mean_entropy for x in d] == pytest.approx([2.5, 3.0, 4.0])  # (2+3+4+5+6)/5 = 4
    assert list(m.state(0).window) == [2.0, 3.0, 4.0, 5.0, 6.0]


def test_classification_uses_the_mean_not_the_raw_value():
    m = mon(window=5, initial_gear="mid")
    d = feed(m, [1.0, 1.0, 1.0, 1.0])  # mean 1.0 -> low at the first token (duration 1)
    assert d[0].gear == "low"
    d = m.observe(0, 9.0)  # one spike: mean (1+1+1+1+9)/5 = 2.6 -> mid, not high
    assert d.mean_entropy == pytest.approx(2.6) and d.gear == "mid"


# ---- hysteresis -------------------------------------------------------------------------------

def test_classify_gear_plain():
    assert classify_gear(1.8, 1.8, 3.5) == "low"     # <= low
    assert classify_gear(1.81, 1.8, 3.5) == "mid"
    assert classify_gear(3.49, 1.8, 3.5) == "mid"
    assert classify_gear(3.5, 1.8, 3.5) == "high"    # >= high


def test_hysteresis_low_extreme():
    m = mon(initial_gear="low")
    assert m.observe(0, 1.85).gear == "low"   # above 1.8 but not by the 0.1 margin
    assert m.observe(0, 1.89).gear == "low"
    d = m.observe(0, 1.95)                    # > 1.8 + 0.1: leaves low
    assert d.gear == "mid" and d.shifted and d.previous_gear == "low"
    assert m.observe(0, 1.85).gear == "mid"   # mid has no margin: 1.85 > 1.8 stays mid
    assert m.observe(0, 1.75).gear == "low"   # <= 1.8 enters low
    assert m.observe(0, 4.0).gear == "high"   # low -> high directly when above theta_high


def test_hysteresis_high_extreme():
    m = mon(initial_gear="high")
    assert m.observe(0, 3.45).gear == "high"  # below 3.5 but not by the margin
    assert m.observe(0, 3.41).gear == "high"
    assert m.observe(0, 3.35).gear == "mid"   # < 3.5 - 0.1: leaves high
    assert m.observe(0, 3.45).gear == "mid"   # from mid, 3.45 < 3.5 stays mid
    assert m.observe(0, 3.5).gear == "high"   # >= 3.5 enters high
    assert m.observe(0, 1.0).gear == "low"    # high -> low directly


def test_hysteresis_uses_scaled_thresholds():
    m = mon(vocab_size=128256, initial_gear="low")  # theta_low = 2.03624
    assert m.observe(0, 2.13).gear == "low"      # <= 2.13624
    assert m.observe(0, 2.14).gear == "mid"


# ---- minimum gear duration ---------------------------------------------------------------------

def test_min_gear_duration():
    m = mon(min_gear_duration=3, initial_gear="mid")
    d = feed(m, [0.5, 0.5])
    assert [x.gear for x in d] == ["mid", "mid"] and [x.desired_gear for x in d] == ["low", "low"]
    assert [x.tokens_in_gear for x in d] == [1, 2]
    d = m.observe(0, 0.5)                       # third token in mid: duration met
    assert d.gear == "low" and d.shifted and d.tokens_in_gear == 0
    d = feed(m, [5.0, 5.0])                     # wants high but low has served only 1, 2 tokens
    assert [x.gear for x in d] == ["low", "low"] and d[-1].desired_gear == "high"
    assert m.observe(0, 5.0).gear == "high"
    assert m.state(0).shifts == 2
    assert m.state(0).tokens_per_gear == {"low": 3, "mid": 3, "high": 0}


def test_default_duration_eight_tokens():
    m = EntropyMonitor(V, initial_gear="high")
    d = feed(m, [0.1] * 8)
    assert [x.gear for x in d] == ["high"] * 7 + ["low"]  # 8 forwards in high, then the shift


def test_set_gear_restarts_duration():
    m = mon(min_gear_duration=2, initial_gear="mid")
    m.observe(0, 2.0)
    m.set_gear(0, "high")
    assert m.gear(0) == "high" and m.state(0).tokens_in_gear == 0


# ---- slope prediction -------------------------------------------------------------------------

def test_slope_prediction():
    m = mon(window=5, min_gear_duration=100, initial_gear="mid")
    d = feed(m, [1.0, 2.0, 3.0, 4.0, 5.0])[-1]
    # mean 3, slope (5 - 1)/4 = 1, H_hat = 3 + 2*1 = 5 -> high; the gear itself stays mid
    assert d.mean_entropy == pytest.approx(3.0) and d.predicted_entropy == pytest.approx(5.0)
    assert d.predicted_gear == "high" and d.gear == "mid"
    m.reset(0, gear="mid")
    d = feed(m, [4.0, 3.5, 3.0, 2.5, 2.0])[-1]   # mean 3, slope -0.5 -> H_hat 2.0 -> mid
    assert d.predicted_entropy == pytest.approx(2.0) and d.predicted_gear == "mid"
    m.reset(0, gear="mid")
    d = feed(m, [3.0, 2.5, 2.0, 1.5, 1.0])[-1]   # mean 2, slope -0.5 -> H_hat 1.0 -> low
    assert d.predicted_entropy == pytest.approx(1.0) and d.predicted_gear == "low"
    assert m.predict(0) == (pytest.approx(1.0), "low")
    m.reset(0, gear="mid")
    d = m.observe(0, 2.2)                        # one value: slope 0, H_hat = mean
    assert d.predicted_entropy == pytest.approx(2.2)


def test_prediction_respects_hysteresis():
    m = mon(window=2, min_gear_duration=100, initial_gear="high")
    d = feed(m, [3.5, 3.45])[-1]  # mean 3.475, slope -0.05, H_hat 3.375 < 3.4 -> leaves high
    assert d.predicted_entropy == pytest.approx(3.375) and d.predicted_gear == "mid"
    m.reset(0, gear="high")
    d = feed(m, [3.5, 3.48])[-1]  # H_hat 3.45 >= 3.4 -> stays high
    assert d.predicted_gear == "high"


# ---- catastrophic fallback ---------------------------------------------------------------------

def test_catastrophic_fallback_overrides_duration():
    m = mon(window=5, min_gear_duration=8, initial_gear="low")
    d = m.observe(0, 14.0)                        # one value above 13.5: not yet
    assert not d.catastrophic and d.gear == "low"
    d = m.observe(0, 14.0)                        # two in a row: high at once
    assert d.catastrophic and d.gear == "high" and d.shifted


def test_catastrophic_needs_two_consecutive_strictly_above():
    m = mon(window=1, min_gear_duration=8, initial_gear="low")
    assert not any(x.catastrophic for x in feed(m, [14.0, 1.0, 14.0]))
    m.reset(0, gear="low")
    assert not any(x.catastrophic for x in feed(m, [13.5, 13.5]))  # not > 0.9 * 15
    m.reset(0, gear="low")
    assert feed(m, [13.6, 13.6])[-1].catastrophic


def test_catastrophic_listing_mode_waits_for_duration():
    m = mon(window=1, min_gear_duration=3, initial_gear="low", catastrophic_overrides_duration=False)
    d = feed(m, [14.0, 14.0])
    assert d[-1].catastrophic and d[-1].gear == "low" and d[-1].desired_gear == "high"
    assert m.observe(0, 14.0).gear == "high"


def test_catastrophic_beats_hysteresis_mean():
    # the window mean only asks for mid, but the last two raw values are catastrophic
    m = mon(window=10, min_gear_duration=1, initial_gear="low")
    feed(m, [0.0] * 8)
    d = feed(m, [13.6, 13.6])[-1]
    assert d.mean_entropy == pytest.approx(2.72) and d.catastrophic and d.gear == "high"
    assert classify_gear(2.72, 1.8, 3.5, "low") == "mid"


def test_non_finite_entropy_counts_as_maximal():
    m = mon(window=1, min_gear_duration=1, initial_gear="low")
    d = feed(m, [float("nan"), float("inf")])
    assert d[0].entropy == 15.0 and d[-1].catastrophic and d[-1].gear == "high"


# ---- calibration ------------------------------------------------------------------------------

def test_calibration_percentiles():
    e10 = [0.1 * i for i in range(1, 11)]
    # n = 10: low e[floor(3) - 1] = e[2] = 0.3, high e[min(9, floor(6))] = e[6] = 0.7
    assert calibrate_thresholds(e10, V) == pytest.approx((0.3, 0.7))
    # n = 5: low e[floor(1.5) - 1] = e[0], high e[min(4, 3)] = e[3]
    assert calibrate_thresholds([0.1, 0.2, 0.3, 0.4, 0.5], V) == pytest.approx((0.1, 0.4))
    # n = 20: low e[5], high e[12]
    assert calibrate_thresholds([0.05 * i for i in range(1, 21)], V) == pytest.approx((0.30, 0.65))
    # n = 7, unsorted input: low e[floor(2.1) - 1] = e[1] = 0.2, high e[floor(4.2)] = e[4] = 0.5
    assert calibrate_thresholds([0.7, 0.1, 0.4, 0.2, 0.6, 0.3, 0.5], V) == pytest.approx((0.2, 0.5))


def test_calibration_low_floor_and_positive_samples():
    e = [0.001, 0.002, 0.003, 0.004, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert calibrate_thresholds(e, V) == pytest.approx((0.01, 0.7))       # max(e[2] = 0.003, 0.01)
    # zeros and non-finite values are not samples: 10 positives remain, same result as e10
    noisy = [0.0, 0.0, float("nan"), -1.0] + [0.1 * i for i in range(1, 11)]
    assert calibrate_thresholds(noisy, V) == pytest.approx((0.3, 0.7))


def test_calibration_band_expansion():
    e = [0.50 + 0.01 * i for i in range(10)]  # low e[2] = 0.52, high e[6] = 0.56: band 0.04 < 0.2
    assert calibrate_thresholds(e, V) == pytest.approx((0.44, 0.64))  # centre 0.54 +- 0.1
    e = [0.02 + 0.001 * i for i in range(10)]  # centre 0.024: 0.024 - 0.1 < 0.01 -> [0.01, 0.21]
    assert calibrate_thresholds(e, V) == pytest.approx((0.01, 0.21))


def test_calibration_caps():
    e = [float(i) for i in range(1, 11)]  # percentiles (3, 7)
    assert calibrate_thresholds(e, V) == pytest.approx((0.9, 1.8))  # 0.06 * 15, 0.12 * 15
    assert calibrate_thresholds(e, 128256) == pytest.approx((0.06 * 16.968667, 0.12 * 16.968667), abs=1e-5)
    # caps apply after the band expansion: (4.94, 5.14) -> (0.9, 1.8)
    assert calibrate_thresholds([5.0 + 0.01 * i for i in range(10)], V) == pytest.approx((0.9, 1.8))


def test_calibration_needs_five_samples():
    assert calibrate_thresholds([1.0, 2.0, 3.0, 4.0], V) is None
    assert calibrate_thresholds([0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0], V) is None  # 4 positives
    m = EntropyMonitor(49152)
    assert not m.calibrate(0, [1.0, 2.0, 3.0, 4.0])
    assert m.thresholds(0) == scaled_thresholds(49152) and not m.state(0).calibrated


def test_monitor_calibration_from_prefill_logits():
    # 10 prefill positions whose entropies are 1..10 bits of a 1024-entry uniform prefix
    v = 1024
    logits = torch.full((10, v), float("-inf"))
    for t in range(10):
        logits[t, : 2 ** (t + 1)] = 0.0  # uniform over 2^(t+1): entropy t + 1 bits
    m = EntropyMonitor(v, 2)
    assert m.calibrate_from_logits(1, logits)
    # percentiles (3, 7) capped at 0.06 * 10 = 0.6 and 0.12 * 10 = 1.2
    assert m.thresholds(1) == pytest.approx((0.6, 1.2))
    assert m.thresholds(0) == scaled_thresholds(v)  # the other row keeps its defaults
    m.reset(1, gear="mid")                          # calibration preserved across reset
    assert m.thresholds(1) == pytest.approx((0.6, 1.2)) and m.gear(1) == "mid"
    m.reset(1, keep_calibration=False)
    assert m.thresholds(1) == scaled_thresholds(v)


def test_manual_thresholds():
    # easy p80: position 0.8 * 4 = 3.2 -> 0.4 + 0.2 * 0.1 = 0.42; hard p20: 2 + 0.8 * 1 = 2.8
    assert manual_thresholds([0.1, 0.2, 0.3, 0.4, 0.5], [2, 3, 4, 5, 6]) == pytest.approx((0.42, 2.8))
    # overlapping populations: the overlap [2.8, 4.2] is the mid band
    assert manual_thresholds([1, 2, 3, 4, 5], [2, 3, 4, 5, 6]) == pytest.approx((2.8, 4.2))
    # narrower than 0.2 bits: widened about the centre 1.05
    assert manual_thresholds([1.0] * 5, [1.1] * 5) == pytest.approx((0.95, 1.15))
    assert percentile([3, 1, 2], 0.5) == 2
    with pytest.raises(ValueError):
        manual_thresholds([], [1.0])


# ---- batch: per-sequence state and the deferred single-transfer step ---------------------------

def test_per_sequence_state():
    m = mon(batch_size=3, window=2, min_gear_duration=2, initial_gear="mid")
    for _ in range(2):
        d = m.commit([0.5, 2.5, 6.0])
    assert [x.gear for x in d] == ["low", "mid", "high"]
    # inactive rows are untouched
    d = m.commit([6.0, 6.0, 6.0], active=[True, False, True])
    assert d[1] is None and m.state(1).tokens_in_gear == 2 and len(m.state(1).window) == 2
    assert m.state(0).tokens_in_gear == 1 and m.gear(0) == "low"  # low held: only 1 token served
    assert m.batch_gear() == "high" and m.batch_gear([True, True, False]) == "mid"
    m.keep([2, 0])
    assert m.gears == ["high", "low"] and m.batch_size == 2
    i = m.add_sequence("mid")
    assert i == 2 and m.gears == ["high", "low", "mid"]
    with pytest.raises(ValueError):
        m.commit([1.0, 2.0])


def test_dispatch_fetch_single_transfer():
    v = 8
    m = EntropyMonitor(v, 3, min_gear_duration=1, window=1, initial_gear="mid")
    logits = torch.full((3, v), float("-inf"))
    logits[0, 0] = 0.0          # one-hot: 0 bits -> low (theta_low = 1.8 * 3/15 = 0.36)
    logits[1, :2] = 0.0         # 1 bit >= theta_high = 3.5 * 3/15 = 0.7 -> high
    logits[2, :] = 0.0          # 3 bits = log2 V -> high; catastrophic needs two steps
    logits = sanitize_logits(logits)
    pending = m.dispatch(logits)
    assert pending.shape == (3,) and pending.dtype == torch.float32
    ids, d = m.fetch(torch.tensor([5, 1, 7]))
    assert ids == [5, 1, 7] and all(isinstance(i, int) for i in ids)
    assert [x.entropy for x in d] == pytest.approx([0.0, 1.0, 3.0], abs=1e-4)
    assert [x.gear for x in d] == ["low", "high", "high"]
    with pytest.raises(RuntimeError):
        m.fetch(torch.tensor([0, 0, 0]))  # nothing pending any more
    # commit with explicit host values (the loop made its own single copy)
    m.dispatch(logits)
    d = m.commit([0.0, None, 3.0])
    assert d[1] is None and d[2].catastrophic
    # large token ids survive the fp64 transfer exactly
    m.dispatch(logits)
    assert m.fetch(torch.tensor([128255, 0, 2 ** 40]))[0] == [128255, 0, 2 ** 40]


def test_needs_entropy():
    m = mon(batch_size=2, min_gear_duration=3)
    assert not m.needs_entropy()      # 0 tokens served; the shift is possible only after 3
    m.commit([2.0, 2.0])
    assert not m.needs_entropy()
    m.commit([2.0, 2.0])
    assert m.needs_entropy()          # tokens_in_gear = 2 = min_gear_duration - 1
    assert max_gear([]) == "low" and max_gear(["low", "high", "mid"]) == "high"


# ---- prompt classifier -----------------------------------------------------------------------

@pytest.mark.parametrize("prompt, n_math, n_code, score, gear", [
    # 6 words, mean length 25/6: 0.3 * 6/50 = 0.036
    ("What is the capital of France?", 0, 0, 0.036, "low"),
    # '+', '=' -> 4; "solve" -> 1.5; 8 words -> 0.048
    ("Solve 3x + 5 = 20 for x.", 2, 1, 5.548, "high"),
    # "python", "function" -> 3.0; 8 words -> 0.048
    ("Write a python function that sorts a list", 0, 2, 3.048, "mid"),
    # mean word length 11 > 6.5 -> 1.5; 2 words -> 0.012
    ("Describe photosynthesis", 0, 0, 1.512, "mid"),
    # intra-word hyphen is not a minus sign
    ("The well-known author wrote a story.", 0, 0, 0.036, "low"),
    # ' - ' and '=' are math; "prove" is a reasoning keyword
    ("Prove that x - y = 2", 2, 1, 5.542, "high"),
    # '^'; "compute", "integral"; 9 words -> 0.054
    ("Compute the integral of x^2 from 0 to 1", 1, 2, 5.054, "high"),
    ("", 0, 0, 0.0, "low"),
    # length term saturates at 3 * 0.3 = 0.9 (200 words)
    (" ".join(["word"] * 200), 0, 0, 0.9, "low"),
])
def test_prompt_classifier(prompt, n_math, n_code, score, gear):
    f = PromptClassifier().features(prompt)
    assert (f.n_math, f.n_code) == (n_math, n_code)
    assert f.score == pytest.approx(score)
    assert f.gear == gear == PromptClassifier()(prompt)


def test_prompt_classifier_boundaries():
    c = PromptClassifier()
    # one word adds 0.3 * 1/50 = 0.006
    assert c.score("=") == pytest.approx(2.006) and c("=") == "mid"      # >= 1.5
    assert c.score("==") == pytest.approx(4.006) and c("==") == "high"   # >= 4.0
    assert c.score("why") == pytest.approx(1.506) and c("why") == "mid"  # one reasoning keyword
    assert c.score("hi") == pytest.approx(0.006) and c("hi") == "low"
    # the thresholds themselves are inclusive
    assert PromptClassifier(high=4.006)("==") == "high"
    assert PromptClassifier(mid=1.506, high=10)("why") == "mid"
    assert PromptClassifier(mid=1.507, high=10)("why") == "low"


# ---- sampling helpers -------------------------------------------------------------------------

def test_sanitize_logits():
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 1.5])
    assert sanitize_logits(x).tolist() == [0.0, 1e4, -1e4, 1.5]


def test_gumbel_floor_and_noise():
    assert GUMBEL_FLOOR == 1e-20
    g = gumbel_noise((100000,), torch.Generator().manual_seed(0))
    assert torch.isfinite(g).all()
    assert float(g.mean()) == pytest.approx(0.5772, abs=0.02)  # Euler-Mascheroni constant


def test_gumbel_max_matches_softmax():
    # N = 200000 draws over a 6-token vocabulary, fixed seed.  sigma of a frequency is at most
    # sqrt(0.3 * 0.7 / N) = 0.00102: max |freq - p| <= 0.005 is a ~5 sigma bound, and the
    # chi-square statistic (5 dof) must stay under 20.52, its 99.9 % quantile.
    p = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30])
    n = 200_000
    logits = p.log().expand(n, -1).contiguous()
    ids = gumbel_max_sample(logits, torch.Generator().manual_seed(1234))
    assert ids.shape == (n,) and ids.dtype == torch.int64
    freq = torch.bincount(ids, minlength=6).double() / n
    assert float((freq - p.double()).abs().max()) <= 0.005
    chi2 = float((((freq - p.double()) * n) ** 2 / (p.double() * n)).sum())
    assert chi2 < 20.52


def test_sample_min_p_temperature_and_determinism():
    p = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30])
    n = 100_000
    logits = p.log().expand(n, -1).contiguous()
    # min_p = 0.5: keep p >= 0.15 (half of 0.30); the rest renormalises
    ids = sample(logits, min_p=0.5, generator=torch.Generator().manual_seed(5))
    freq = torch.bincount(ids, minlength=6).double() / n
    assert freq[0] == 0 and freq[1] == 0
    kept = p[2:] / p[2:].sum()
    assert float((freq[2:] - kept.double()).abs().max()) <= 0.006
    # the filter itself, per-row min_p
    f = min_p_filter(p.log().expand(2, -1), torch.tensor([0.0, 0.9]))
    assert torch.isfinite(f[0]).all() and torch.isfinite(f[1]).tolist() == [False] * 5 + [True]
    # same seed, same tokens; temperature 0 is greedy
    a = sample(logits[:100], generator=torch.Generator().manual_seed(9))
    b = sample(logits[:100], generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)
    assert sample(logits[:4], temperature=0).tolist() == [5] * 4
    # NaN logits do not break sampling (the guard runs first)
    bad = torch.tensor([[float("nan"), float("inf"), 0.0]])
    assert sample(bad, generator=torch.Generator().manual_seed(0)).tolist() == [1]


def test_temperature_sharpens():
    p = torch.tensor([0.2, 0.8])
    n = 100_000
    ids = sample(p.log().expand(n, -1).contiguous(), temperature=0.5, generator=torch.Generator().manual_seed(3))
    q = p ** 2 / (p ** 2).sum()  # softmax(log p / 0.5)
    assert float(ids.double().mean()) == pytest.approx(float(q[1]), abs=0.005)


# ---- GPU: the deferred step makes exactly one device->host transfer --------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_step_has_no_hidden_sync():
    dev = torch.device("cuda")
    b, v = 4, 32000
    m = EntropyMonitor(v, b, min_gear_duration=1)
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(b, v, device=dev, dtype=torch.bfloat16) * 3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        x = sanitize_logits(logits)
        h = m.dispatch(x)
        ids = sample(x, temperature=0.8, min_p=0.05, generator=gen)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert h.device.type == "cuda" and ids.device.type == "cuda"
    host_ids, d = m.fetch(ids)
    assert host_ids == ids.tolist()
    ref = entropy_bits(logits.float().cpu())
    assert [x.entropy for x in d] == pytest.approx(ref.tolist(), abs=1e-3)
