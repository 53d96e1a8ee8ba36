"""gearshift/dispatch/step_search.py (CPU): which candidates a shape is searched over, the coordinate
descent on a step timer, and the map a set of choices makes."""

import json

import pytest

from gearshift.dispatch.policy import PolicyMap
from gearshift.dispatch.policy import parse_candidate
from gearshift.dispatch.step_search import (adopt, candidates, coordinate_descent, same_candidate, with_choices,
                                         with_triggers)
from gearshift.kernels.config import TileConfig

CFG = {"bm": 16, "bn": 0, "bk": 128, "split_k": 1, "warps": 8, "stages": 1, "kwarps": 8}
KEY = "w4a16:g128:64x128"


def _name(**over):
    return "w4a16_mma@" + json.dumps(CFG | over, sort_keys=True)


def _map():
    timings = {_name(): 5.0, _name(warps=4, kwarps=4): 4.0, _name(warps=16): 6.0, _name(bm=8): None,
               _name(warps=2, kwarps=2): 7.0}
    return PolicyMap.from_json({"version": 1, "device": "GPU", "buckets": [1, 2], "meta": {},
                                "entries": {KEY: {"1": {"strategy": "w4a16_mma", "config": dict(CFG), "us": 5.0},
                                                  "2": {"strategy": "w4a16_mma", "config": dict(CFG), "us": 6.0}}},
                                "timings": {KEY: {"1": timings}}})


def test_candidates_start_with_the_shipped_pick_then_the_fastest():
    c = candidates(_map(), KEY, 1, 3)
    # the shipped tile first (even where a faster one was timed), no duplicate, untimed ones never
    assert same_candidate(c[0], _name())
    assert same_candidate(c[1], _name(warps=4, kwarps=4)) and same_candidate(c[2], _name(warps=16))
    assert len(c) == 3
    assert len(candidates(_map(), KEY, 1, 10)) == 4  # bm=8 was never timed
    assert len(candidates(_map(), KEY, 2, 5)) == 1  # nothing timed at M = 2: the pick alone


def test_with_triggers_adds_each_fragment_tile_at_each_trigger_point():
    base = [_name(), "w4a16_wgmma@" + json.dumps({"bm": 64, "bn": 64, "warps": 4}), "w4a16_mma@" + json.dumps(CFG | {"trigger": 2})]
    out = with_triggers(base, [1, 2, 3])
    assert out[:3] == base  # the shipped pick stays first
    added = [parse_candidate(c) for c in out[3:]]
    # the first tile at 1 and 3 (its 2 is the third candidate already), nothing for the wgmma tile
    assert [(s, c.trigger) for s, c in added] == [("w4a16_mma", 1), ("w4a16_mma", 3)]
    assert all(c.bm == 16 and c.warps == 8 and c.kwarps == 8 for _, c in added)


def test_tile_trigger_round_trips_and_names_the_tile():
    cfg = TileConfig(bm=16, warps=8, kwarps=8, trigger=3)
    assert TileConfig.from_dict(cfg.to_dict()) == cfg and cfg.key().endswith("t3")
    # the rule (-1) is the default and leaves the serialized form (and candidate names) as before
    assert "trigger" not in TileConfig(bm=16).to_dict() and "t" not in TileConfig(bm=16).key()[-2:]


def test_with_choices_changes_only_that_bucket():
    base = _map()
    pm = with_choices(base, {KEY: _name(warps=4, kwarps=4)}, 1)
    assert pm.lookup(KEY, 1).config.warps == 4
    assert pm.lookup(KEY, 2).config.warps == 8
    assert base.lookup(KEY, 1).config.warps == 8  # the base map is untouched


def _timer(costs: dict, calls: list):
    """A step timer: the sum of each key's cost under the choices."""
    def time_fn(choices):
        calls.append(dict(choices))
        return sum(costs[k][c] for k, c in choices.items())
    return time_fn


def test_descent_takes_a_confirmed_gain_and_keeps_the_rest():
    cands = {"a": ["a0", "a1", "a2"], "b": ["b0", "b1"]}
    costs = {"a": {"a0": 10.0, "a1": 9.0, "a2": 9.5}, "b": {"b0": 5.0, "b1": 5.01}}
    calls = []
    cur, log = coordinate_descent(cands, _timer(costs, calls), passes=3, confirm=2, min_gain=0.005)
    assert cur == {"a": "a1", "b": "b0"}  # b1 is 0.07% slower: not taken
    taken = [e for e in log if e.get("taken")]
    assert [e["key"] for e in taken] == ["a"] and taken[0]["ratio"] == pytest.approx(14.0 / 15.0)
    # the second pass changed nothing, so the search stopped there (no third pass)
    assert max(e["pass"] for e in log) == 1
    # every alternative was timed with the other key at its current pick
    assert {"a": "a2", "b": "b0"} in calls and {"a": "a1", "b": "b1"} in calls


def test_descent_needs_the_gain_to_clear_min_gain_and_skips_failing_candidates():
    cands = {"a": ["a0", "bad", "a1"]}
    costs = {"a": {"a0": 10.0, "a1": 9.96}}

    def time_fn(choices):
        if choices["a"] == "bad":
            raise RuntimeError("out of resources")
        return costs["a"][choices["a"]]

    ticks = []
    cur, log = coordinate_descent(cands, time_fn, min_gain=0.005, on_try=lambda: ticks.append(1))
    assert cur == {"a": "a0"}  # 0.4% faster is below the 0.5% asked
    assert any(e.get("cand") == "bad" and "out of resources" in e["error"] for e in log)
    assert len(ticks) == 2  # one progress tick per alternative tried, failed ones included


def test_adopt_writes_only_changed_picks_with_their_profiled_time():
    pm = _map()
    changed = adopt(pm, {KEY: _name(warps=4, kwarps=4)}, 1)
    assert changed == [KEY]
    assert pm.lookup(KEY, 1).config.warps == 4 and pm.lookup(KEY, 1).us == 4.0
    assert adopt(pm, {KEY: _name(warps=4, kwarps=4)}, 1) == []  # already the pick
    assert pm.lookup(KEY, 2).config.warps == 8


def test_refine_map_keeps_what_the_decode_step_confirms(monkeypatch):
    """`gearshift profile --refine` (cli/refine.py) on a fake decode step whose time is the sum of the
    picks' costs: the faster alternative of the one shape is adopted, recorded and reported."""
    import gearshift.model.step_timer as step_timer
    import gearshift.model.tiny as tiny
    from gearshift.cli.refine import refine_map, refine_points

    cost = {8: 5.0, 4: 4.0, 16: 6.0, 2: 7.0}  # by warps, as _map's timings
    built = []

    class FakeTimer:
        def __init__(self, model, mode, batch, context=512):
            assert (mode, batch, context) == ("w4a16", 1, 64)

        def ms(self, dispatcher):
            return cost[dispatcher.policy.lookup(KEY, 1).config.warps]

    monkeypatch.setattr(step_timer, "DecodeStepTimer", FakeTimer)
    monkeypatch.setattr(tiny, "build_random_model", lambda *a, **kw: built.append((a, kw)) or object())
    pm = _map()
    shapes = [("x", 64, 128), ("y", 64, 128)]  # the same key twice: searched once
    assert refine_points(pm, shapes, ["w4a16"], [1], 128, 4) == 3
    said = []
    recs = refine_map(pm, "llama3-8b", shapes, ["w4a16", "w4a8"], [1], group=128, int4_prog=False,
                      int4_layout="blocks16", top=4, context=64, say=said.append)
    assert built and built[0][1]["weights"] == "int4" and built[0][1]["group_size"] == 128
    assert [(r["mode"], r["m"], r["changed"]) for r in recs] == [("w4a16", 1, [KEY])]
    assert recs[0]["ms_before"] == 5.0 and recs[0]["ms_after"] == 4.0
    assert pm.lookup(KEY, 1).config.warps == 4 and pm.lookup(KEY, 2).config.warps == 8
    assert any("w4a8" in line and "nothing to refine" in line for line in said)
    assert any("5.000 -> 4.000 ms" in line for line in said)


KEY2 = "w4a16:g128:128x64"


def _two_shape_map(a_warps: int, b_warps: int) -> PolicyMap:
    """Picks of warps a_warps / b_warps at M = 1 for KEY / KEY2, each with the other tile timed."""
    def entry(w):
        return {"1": {"strategy": "w4a16_mma", "config": CFG | {"warps": w, "kwarps": w}, "us": 5.0}}

    def timed(w):
        return {"1": {_name(warps=w, kwarps=w): 5.0, _name(warps=12 - w, kwarps=12 - w): 6.0}}

    return PolicyMap.from_json({"version": 1, "device": "GPU", "buckets": [1, 2], "meta": {},
                                "entries": {KEY: entry(a_warps), KEY2: entry(b_warps)},
                                "timings": {KEY: timed(a_warps), KEY2: timed(b_warps)}})


@pytest.mark.parametrize("profiled_ms, seed_ms, kept_seed", [(5.0, 4.0, True), (4.0, 5.0, False), (4.0, 4.0, True)])
def test_a_refined_point_must_beat_the_seeds_picks_on_the_step(monkeypatch, profiled_ms, seed_ms, kept_seed):
    """With an incumbent map (`gearshift profile --seed ... --refine`), its picks join the candidates, and
    the refined picks replace them only when faster on the step by more than min_gain. The fake step
    is not a sum over shapes: one shape's seed pick alone is slower (5.5 ms), so the coordinate search
    never takes it, and only the comparison of the whole sets finds the seed's picks faster."""
    import gearshift.model.step_timer as step_timer
    import gearshift.model.tiny as tiny
    from gearshift.cli.refine import refine_map, refine_points

    step = {(8, 8): profiled_ms, (4, 4): seed_ms, (4, 8): 5.5, (8, 4): 5.5}

    class FakeTimer:
        def __init__(self, model, mode, batch, context=512):
            pass

        def ms(self, dispatcher):
            pol = dispatcher.policy
            return step[(pol.lookup(KEY, 1).config.warps, pol.lookup(KEY2, 1).config.warps)]

    monkeypatch.setattr(step_timer, "DecodeStepTimer", FakeTimer)
    monkeypatch.setattr(tiny, "build_random_model", lambda *a, **kw: object())
    pm, seed = _two_shape_map(8, 8), _two_shape_map(4, 4)
    seed.device = "Seed GPU"
    shapes = [("x", 64, 128), ("y", 128, 64)]
    # each shape: its pick, the other tile it timed (the seed's pick, 4 warps), nothing added
    assert refine_points(pm, shapes, ["w4a16"], [1], 128, 2, incumbent=seed) == 2
    said = []
    recs = refine_map(pm, "llama3-8b", shapes, ["w4a16"], [1], group=128, int4_prog=False, int4_layout="blocks16",
                      top=1, context=64, incumbent=seed, say=said.append)
    rec = recs[0]
    assert rec["kept_incumbent"] is kept_seed and rec["ms_incumbent"] == seed_ms and rec["ms_before"] == profiled_ms
    want = 4 if kept_seed else 8
    assert (pm.lookup(KEY, 1).config.warps, pm.lookup(KEY2, 1).config.warps) == (want, want)
    assert rec["changed"] == ([KEY, KEY2] if kept_seed else [])
    assert rec["ms_after"] == (seed_ms if kept_seed else profiled_ms)
    assert "Seed GPU's picks" in said[0] and ("the refined ones were not faster" in said[0]) is kept_seed
    # without the incumbent nothing joins the candidates (top=1: the pick alone) and nothing is compared
    pm2 = _two_shape_map(8, 8)
    assert refine_points(pm2, shapes, ["w4a16"], [1], 128, 1) == 0
    rec2 = refine_map(pm2, "llama3-8b", shapes, ["w4a16"], [1], group=128, int4_prog=False, int4_layout="blocks16",
                      top=1, context=64, say=said.append)[0]
    assert "kept_incumbent" not in rec2 and rec2["changed"] == []
