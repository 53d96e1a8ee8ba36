"""Where two greedy runs of the same mode first part, and whether that is a floating-point tie.

Correctness contract 1 (DESIGN.md): greedy QSPEC equals greedy AR in the verify mode up to floating-point
ties, which must be detected and reported, not hidden. The two runs reach the same logits through different
kernels (one-token decode steps against a gamma + 1-token verify pass), whose sums round in different orders,
so where the mode's two best logits lie within that rounding the argmax may differ without any bug. At the
first position where the token lists differ, the context is scored once in the verify mode (eager, in a cache
of its own) and both tokens' logits are compared: a gap within `TIE_EPS` units of the compute dtype's epsilon,
relative to the top logit, is called a tie. The numbers are reported either way, so a reader can judge.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from gearshift.engine.scoring import eager_logits

#: a gap between the two tokens' logits of at most this many epsilons of the compute dtype, relative to
#: max(1, |top logit|), is a tie: bf16 3.1%, fp16 0.39%, fp32 4.8e-7 (the CPU tests' 1e-5 is coarser)
TIE_EPS = 4


@dataclass
class Divergence:
    sequence: int  # index of the sequence in the batch
    position: int  # generated position (0 = the first generated token)
    ar_token: int
    other_token: int
    ar_logit: float  # the verify mode's logits of both tokens at that position
    other_logit: float
    top_logit: float
    top_token: int
    tie: bool

    @property
    def gap(self) -> float:
        return abs(self.ar_logit - self.other_logit)

    def to_dict(self) -> dict:
        return {**asdict(self), "gap": self.gap}

    def describe(self, other: str = "QSPEC") -> str:
        rel = self.gap / max(1.0, abs(self.top_logit))
        verdict = "a floating-point tie" if self.tie else "no tie: a bug worth reporting"
        return (f"sequence {self.sequence} first differs at generated token {self.position} (AR {self.ar_token}, "
                f"{other} {self.other_token}); the verify mode's logits there are {self.ar_logit:.5g} and "
                f"{self.other_logit:.5g} (gap {self.gap:.3g}, {100 * rel:.3g}% of the top logit): {verdict}")


def first_difference(ref: list[int], got: list[int]) -> int | None:
    """The first index where the lists differ (the shorter one's length if one is a prefix), None if equal."""
    if ref == got:
        return None
    return next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))


def first_divergence(model, prompts: list[list[int]], ref: list[list[int]], got: list[list[int]],
                     mode: str) -> Divergence | None:
    """The first sequence whose generated tokens `got` differ from `ref` (greedy AR in `mode`), with the
    verify mode's logits of both tokens where they part; None if every sequence agrees or they differ only
    in length."""
    for s, (p, r, g) in enumerate(zip(prompts, ref, got)):
        j = first_difference(r, g)
        if j is None or j >= min(len(r), len(g)):
            continue
        logits = eager_logits(model, list(p) + list(r[:j]), mode, "last")[-1].float()
        top = int(logits.argmax())
        top_logit, a, b = float(logits[top]), float(logits[r[j]]), float(logits[g[j]])
        tol = TIE_EPS * torch.finfo(model.dtype).eps * max(1.0, abs(top_logit))
        tie = abs(a - b) <= tol and min(a, b) >= top_logit - tol
        return Divergence(s, j, int(r[j]), int(g[j]), a, b, top_logit, top, tie)
    return None
