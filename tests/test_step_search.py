"""benchmarks/step_search.py's bookkeeping (CPU): which candidates a shape is searched over, and the
map a set of choices makes."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
step_search = pytest.importorskip("step_search")

from gearshift.dispatch.policy import PolicyMap  # noqa: E402

CFG = {"bm": 16, "bn": 0, "bk": 128, "split_k": 1, "warps": 8, "stages": 1, "kwarps": 8}


def _name(**over):
    return "w4a16_mma@" + json.dumps(CFG | over, sort_keys=True)


def _map():
    key = "w4a16:g128:64x128"
    timings = {_name(): 5.0, _name(warps=4, kwarps=4): 4.0, _name(warps=16): 6.0, _name(bm=8): None,
               _name(warps=2, kwarps=2): 7.0}
    return {"version": 1, "device": "GPU", "buckets": [1, 2], "meta": {},
            "entries": {key: {"1": {"strategy": "w4a16_mma", "config": dict(CFG), "us": 5.0},
                              "2": {"strategy": "w4a16_mma", "config": dict(CFG), "us": 6.0}}},
            "timings": {key: {"1": timings}}}


def test_candidates_start_with_the_shipped_pick_then_the_fastest():
    pm = _map()
    c = step_search.candidates(pm, "w4a16:g128:64x128", 1, 3)
    # the shipped tile first (even where a faster one was timed), no duplicate, untimed ones never
    assert step_search._same(c[0], _name())
    assert step_search._same(c[1], _name(warps=4, kwarps=4)) and step_search._same(c[2], _name(warps=16))
    assert len(c) == 3
    assert len(step_search.candidates(pm, "w4a16:g128:64x128", 1, 10)) == 4  # bm=8 was never timed


def test_with_choices_changes_only_that_bucket():
    base = PolicyMap.from_json(_map())
    pm = step_search.with_choices(base, {"w4a16:g128:64x128": _name(warps=4, kwarps=4)}, 1)
    assert pm.lookup("w4a16:g128:64x128", 1).config.warps == 4
    assert pm.lookup("w4a16:g128:64x128", 2).config.warps == 8
    assert base.lookup("w4a16:g128:64x128", 1).config.warps == 8  # the base map is untouched
