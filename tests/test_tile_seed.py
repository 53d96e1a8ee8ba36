"""benchmarks/mma_ablations/tile_seed.py (CPU): which tiles a flag's seed leaves to time, and which
points `take` and `twins` change."""

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "mma_ablations"))
tile_seed = pytest.importorskip("tile_seed")

from gearshift.dispatch.policy import candidate_name  # noqa: E402
from gearshift.kernels.config import TileConfig  # noqa: E402

KEY = "w4a16:g128:256x4096"
FAST, MID, SLOW = (TileConfig(16, 0, 128, 1, w, 1, kwarps=w) for w in (8, 4, 2))
PICK = TileConfig(16, 0, 128, 1, 16, 1, kwarps=16)  # the map's pick (chosen on whole steps), slowest timed


def name(cfg: TileConfig) -> str:
    return candidate_name("w4a16_mma", cfg)


def write_map(path: Path) -> Path:
    timings = {name(FAST): 1.0, name(MID): 2.0, name(SLOW): 3.0, name(PICK): 4.0}
    d = {"version": 1, "device": "GPU", "buckets": [1, 2, 4], "meta": {},
         "entries": {KEY: {m: {"strategy": "w4a16_mma", "config": PICK.to_dict(), "us": 4.0} for m in ("1", "2")}},
         "timings": {KEY: {"1": dict(timings), "2": dict(timings)}}}
    path.write_text(json.dumps(d))
    return path


def twin(cfg: TileConfig) -> str:
    return name(TileConfig(**(cfg.to_dict() | {"ksum": True})))


def test_the_seed_leaves_only_the_twins_of_the_best_tiles_and_the_pick_untimed(tmp_path):
    out = tmp_path / "seed.json"
    tile_seed.seed(Namespace(map=str(write_map(tmp_path / "map.json")), strategy="w4a16_mma", modes="w4a16",
                             m="1", top=1, flag="ksum", all=False, out=str(out)))
    point = json.loads(out.read_text())["timings"][KEY]["1"]
    # left untimed (so a --new-tiles run times them): the twins of the fastest tile and of the map's pick
    assert twin(FAST) not in point and twin(PICK) not in point
    # everything else counts as timed, the other tiles' twins too
    assert point[twin(MID)] is None and point[twin(SLOW)] is None
    assert point[name(FAST)] == 1.0  # timings kept
    assert sum(v is None for v in point.values()) > 50  # (the strategy's other tiles)
    # --all: every flagged tile left untimed (stop 41's xshare seed)
    tile_seed.seed(Namespace(map=str(tmp_path / "map.json"), strategy="w4a16_mma", modes="w4a16", m="1", top=1,
                             flag="ksum", all=True, out=str(out)))
    point = json.loads(out.read_text())["timings"][KEY]["1"]
    assert twin(MID) not in point and not any(tile_seed.has_flag(c, "ksum") for c in point)


def test_take_merges_only_points_a_flagged_tile_won(tmp_path):
    base = write_map(tmp_path / "map.json")
    prof = {"timings": {KEY: {"1": {name(FAST): 1.0, twin(FAST): 0.5}, "2": {name(FAST): 1.0, twin(FAST): 1.5}}}}
    (tmp_path / "prof.json").write_text(json.dumps(prof))
    out = tmp_path / "out.json"
    tile_seed.take(Namespace(map=str(base), profile=str(tmp_path / "prof.json"), note="n", m="", flag="ksum",
                             out=str(out)))
    d = json.loads(out.read_text())
    assert TileConfig.from_dict(d["entries"][KEY]["1"]["config"]).ksum and d["entries"][KEY]["1"]["us"] == 0.5
    assert d["entries"][KEY]["2"]["config"] == PICK.to_dict()  # the plain tile won there: unchanged
    assert d["timings"][KEY]["1"][twin(FAST)] == 0.5 and d["meta"]["merged"] == [f"n: {KEY} M=1"]
    tile_seed.take(Namespace(map=str(base), profile=str(tmp_path / "prof.json"), note="n", m="2", flag="ksum",
                             out=str(out)))
    assert json.loads(out.read_text())["entries"][KEY]["1"]["config"] == PICK.to_dict()  # --m 2 only


def test_twins_swap_each_pick_for_its_flag_twin_where_it_fits(tmp_path):
    out = tmp_path / "out.json"
    tile_seed.twins(Namespace(map=str(write_map(tmp_path / "map.json")), strategy="w4a16_mma", modes="w4a16",
                              m="1", flag="ksum", note="n", out=str(out)))
    d = json.loads(out.read_text())
    assert TileConfig.from_dict(d["entries"][KEY]["1"]["config"]) == TileConfig(**(PICK.to_dict() | {"ksum": True}))
    assert d["entries"][KEY]["2"]["config"] == PICK.to_dict()  # not asked for
