"""Sampled QSPEC follows the verify mode's distribution (Leviathan et al.'s rejection rule).

On a tiny random model with top-k 4, the first two generated tokens take one of 16 values
(t1, t2). We compute their exact verify-mode (w4a16) probability P(t1) P(t2 | t1) from
`filtered_logprobs`, draw N = 2400 QSPEC generations (w4a4 draft, gamma 2, one seed per
request: every accept / residual / bonus path of the first cycle is exercised) and run a
chi-square goodness-of-fit test at significance ALPHA = 1e-3. Seeds are fixed, so the test is
deterministic. The w4a4 draft's distribution is far from w4a16's here (total variation ~0.14,
different top-4 sets), so wrong acceptance rules must fail the same test: `test_detects_wrong_rules`
checks that it rejects "accept every draft" and "resample from p instead of the residual".
Each test runs both cycles: the step-by-step one, which draws and accepts on the host
(`accept_sampled`), and the chained one, which does both on the device (`accept_rows`).
"""

import pytest
import torch

from gearshift.decode.qspec import QSpecPolicy
from gearshift.decode.sampling import SamplingParams, draw_rows, filtered_logprobs
from gearshift.engine.engine import Engine, Request
from gearshift.model.loader import load_model, quantize_linears

scipy_stats = pytest.importorskip("scipy.stats")

PROMPT = [12, 13, 14, 15, 16]
N = 2400
ALPHA = 1e-3


def params(seed, stop=None):
    return SamplingParams(temperature=1.0, top_k=4, seed=seed, max_new_tokens=3, ignore_eos=True,
                          stop_token_ids=stop)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tiny_int4):
    return tiny_int4


def next_probs(lm, context, mode):
    cache = lm.model.new_cache(1, len(context) + 1)
    logits = lm.model(torch.tensor([context]), cache, [0], [len(context)], mode=mode, logits="last")[0, 0]
    return filtered_logprobs(logits, params(0)).exp()


def exact_pairs(lm, mode="w4a16") -> dict[tuple[int, int], float]:
    p1 = next_probs(lm, PROMPT, mode)
    out = {}
    for a in p1.nonzero().flatten().tolist():
        p2 = next_probs(lm, PROMPT + [a], mode)
        for b in p2.nonzero().flatten().tolist():
            out[(a, b)] = float(p1[a] * p2[b])
    return out


@pytest.fixture(scope="module")
def exact(lm):
    return exact_pairs(lm)


def sample_pairs(lm, policy, stop=None) -> dict[tuple[int, int], int]:
    eng = Engine(lm, max_batch=400)
    res = eng.generate([Request(list(PROMPT), params(seed, stop)) for seed in range(N)], policy)
    counts: dict[tuple[int, int], int] = {}
    for r in res:
        key = tuple(r.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    return counts, eng.last_stats


def goodness_of_fit(exact, counts) -> tuple[int, float, float]:
    """(samples outside the support, chi-square statistic, p-value) over the 16 cells."""
    outside = sum(n for k, n in counts.items() if k not in exact)
    cells = sorted(exact)
    obs = [counts.get(k, 0) for k in cells]
    total = sum(obs)
    exp = [exact[k] * total for k in cells]
    scale = sum(obs) / sum(exp)  # exact sums to 1 up to float rounding
    stat, pval = scipy_stats.chisquare(obs, [e * scale for e in exp])
    return outside, float(stat), float(pval)


CYCLES = pytest.mark.parametrize("chained", [False, True], ids=["host", "device"])


@CYCLES
def test_sampled_qspec_matches_verify_distribution(lm, exact, chained):
    assert len(exact) == 16 and abs(sum(exact.values()) - 1) < 1e-5
    draft = exact_pairs(lm, "w4a4")
    tv = 0.5 * sum(abs(exact.get(k, 0) - draft.get(k, 0)) for k in set(exact) | set(draft))
    assert tv > 0.05  # the draft really differs: rejections and residual draws happen
    counts, stats = sample_pairs(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", gamma=2, chained_drafts=chained))
    assert 0.2 < stats["acceptance_rate"] < 0.95
    outside, stat, pval = goodness_of_fit(exact, counts)
    assert outside == 0, f"{outside} samples have zero verify-mode probability"
    assert pval > ALPHA, f"chi-square {stat:.1f} (15 dof), p = {pval:.2g} < {ALPHA}: QSPEC != verify-mode sampling"


@CYCLES
def test_a_stop_token_among_the_drafts_keeps_the_distribution(lm, exact, chained):
    """With a stop token that both modes draft often, a first token t1 that is a stop ends the output: outcomes
    (t1,) for the stop and (t1, t2) otherwise, with their verify-mode probabilities. (The chained cycle verifies
    past a drafted stop; what it then appends is trimmed by the engine, so `_kept`'s cut is tested below.)"""
    p1, q1 = next_probs(lm, PROMPT, "w4a16"), next_probs(lm, PROMPT, "w4a4")
    stop = int(torch.minimum(p1, q1).argmax())
    assert p1[stop] > 0.1 and q1[stop] > 0.1
    want: dict[tuple, float] = {}
    for (a, b), pr in exact.items():
        key = (a,) if a == stop else (a, b)
        want[key] = want.get(key, 0.0) + pr
    counts, _ = sample_pairs(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", gamma=2, chained_drafts=chained), [stop])
    assert counts.get((stop,), 0) > 0.1 * N
    outside, stat, pval = goodness_of_fit(want, counts)
    assert outside == 0 and pval > ALPHA, f"chi-square {stat:.1f}, p = {pval:.2g}"


def test_a_row_cut_by_a_stop_draws_its_token_after_the_kept_drafts():
    """`QSpecPolicy._kept`: the device's (accepted, token) over the whole budget stands where it rejected among
    the kept drafts or kept them all; where a stop cut the drafts and all kept ones were accepted, the token is
    drawn at the position after them."""

    class Rows:
        def bonus(self, slot, at):
            return 1000 + at

    kept = QSpecPolicy._kept
    assert kept(Rows(), 0, [1, 7], 2, 3) == (1, 7)  # rejected the second of 2 kept drafts
    assert kept(Rows(), 0, [3, 7], 3, 3) == (3, 7)  # no stop: the bonus token of the whole budget
    assert kept(Rows(), 0, [3, 7], 2, 3) == (2, 1002)  # both kept drafts accepted, the third past the stop
    assert kept(Rows(), 0, [2, 7], 2, 3) == (2, 1002)  # rejected past the stop: not a rejection of the kept ones


class AcceptEverything(QSpecPolicy):
    def accept_sampled(self, p, q, d, generator):
        return len(d), self._draw(p[len(d)], generator)

    def accept_rows(self, p, q, d, g, generators):
        n = torch.tensor(g, device=p.device)
        return n, draw_rows(p[torch.arange(len(g)), n], generators)


class ResampleFromP(QSpecPolicy):
    """The classic bug: on rejection, draw from p instead of norm(max(0, p - q))."""

    def accept_sampled(self, p, q, d, generator):
        for i, tok in enumerate(d):
            ratio = float(p[i][tok]) / float(q[i][tok])
            if ratio >= 1.0 or self._uniform(generator) < ratio:
                continue
            return i, self._draw(p[i], generator)
        return len(d), self._draw(p[len(d)], generator)

    def accept_rows(self, p, q, d, g, generators):
        n, _ = super().accept_rows(p, q, d, g, generators)  # the right acceptance, then p's draw at n
        return n, draw_rows(p[torch.arange(len(g)), n], generators)


@CYCLES
@pytest.mark.parametrize("wrong", [AcceptEverything, ResampleFromP])
def test_detects_wrong_rules(lm, exact, wrong, chained):
    """The same test, with the same N and ALPHA, rejects deliberately wrong acceptance rules."""
    counts, _ = sample_pairs(lm, wrong(lm.model, "w4a4", "w4a16", gamma=2, chained_drafts=chained))
    outside, stat, pval = goodness_of_fit(exact, counts)
    assert outside > 0 or pval < ALPHA, f"{wrong.__name__} passed the goodness-of-fit test (p = {pval:.3g})"
    if wrong is ResampleFromP:  # in-support error: the chi-square statistic itself must catch it
        assert outside == 0 and pval < ALPHA


if __name__ == "__main__":  # prints the numbers behind the tests
    import sys
    import tempfile

    from gearshift.model.tiny import write_random_model

    torch.set_num_threads(1)
    d = tempfile.mkdtemp() + "/tiny"
    write_random_model(d, "tiny")
    m = load_model(d, progress=False)
    quantize_linears(m, "int4", 32, progress=False)
    ex = exact_pairs(m)
    for pol in (QSpecPolicy, AcceptEverything, ResampleFromP):
        c, st = sample_pairs(m, pol(m.model, "w4a4", "w4a16", gamma=2))
        o, s, pv = goodness_of_fit(ex, c)
        print(f"{pol.__name__:18s} outside={o} chi2={s:.1f} p={pv:.3g} acceptance={st['acceptance_rate']}",
              file=sys.stderr)
