"""engine/divergence.py: where two greedy runs part, and whether that is a floating-point tie."""

import torch

from gearshift.engine import divergence
from gearshift.engine.divergence import Divergence, first_difference, first_divergence


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_runner_up_token_is_no_tie_and_a_wide_tolerance_makes_it_one(tiny_int4, monkeypatch):
    model = tiny_int4.model
    prompt, ref = [5, 6, 7], [8, 9]
    ids = prompt + ref[:1]
    logits = model.forward_lists(torch.tensor([ids]), model.new_cache(1, 8), [0], [4], 4, "w4a16", "last")[0, -1]
    top2 = logits.float().topk(2).indices.tolist()
    ref = [8, top2[0]]
    got = [8, top2[1]]
    div = first_divergence(model, [[9, 9], prompt], [[1], ref], [[1], got], "w4a16")
    assert (div.sequence, div.position, div.ar_token, div.other_token, div.top_token) == (1, 1, top2[0], top2[1],
                                                                                            top2[0])
    assert div.gap > 0 and not div.tie and "no tie" in div.describe()
    monkeypatch.setattr(divergence, "TIE_EPS", 1e9)
    div = first_divergence(model, [prompt], [ref], [got], "w4a16")
    assert div.tie and "a floating-point tie" in div.describe()
    assert Divergence(0, 0, 1, 2, 1.0, 0.5, 1.0, 1, False).to_dict()["gap"] == 0.5
