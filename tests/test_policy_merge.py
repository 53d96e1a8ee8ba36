"""benchmarks/policy_merge.py: takes only the named modes and M buckets from the new map."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "policy_merge.py"


def _map(device: str, tag: str) -> dict:
    entry = {"strategy": f"s_{tag}", "config": None, "us": 1.0}
    return {"version": 1, "device": device, "buckets": [1, 2, 4], "meta": {}, "timings": {},
            "entries": {"w4a16:g128:64x64": {"1": entry, "2": entry, "4": entry},
                        "w4a8:g128:64x64": {"1": entry, "2": entry}}}


def _run(tmp_path, base, new, *args):
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "new.json").write_text(json.dumps(new))
    return subprocess.run([sys.executable, str(SCRIPT), "--base", str(tmp_path / "base.json"), "--new",
                           str(tmp_path / "new.json"), "--out", str(tmp_path / "out.json"), *args],
                          capture_output=True, text=True)


def test_merges_only_named_modes_and_buckets(tmp_path):
    r = _run(tmp_path, _map("H100", "old"), _map("H100", "new"), "--modes", "w4a16", "--m", "1,2", "--note", "A/B")
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    w16, w8 = out["entries"]["w4a16:g128:64x64"], out["entries"]["w4a8:g128:64x64"]
    assert [w16[m]["strategy"] for m in ("1", "2", "4")] == ["s_new", "s_new", "s_old"]
    assert w8["1"]["strategy"] == "s_old" and "A/B" in out["meta"]["merged"][-1]


def test_refuses_maps_of_other_devices(tmp_path):
    r = _run(tmp_path, _map("H100", "old"), _map("A100", "new"), "--modes", "w4a16", "--m", "1")
    assert r.returncode != 0 and "device mismatch" in r.stderr + r.stdout
    assert not (tmp_path / "out.json").exists()


def test_timed_candidates_join_the_base_ones(tmp_path):
    """The new map's timings at the merged buckets are added to the base's (newer times win), so
    the dispatcher's fallback for stores the new pick cannot run still sees the old candidates."""
    base, new = _map("H100", "old"), _map("H100", "new")
    key = "w4a8:g128:64x64"
    base["timings"] = {key: {"1": {"old@a": 3.0, "both@b": 5.0}, "2": {"old@a": 4.0}}}
    new["timings"] = {key: {"1": {"new@c": 2.0, "both@b": 6.0}, "2": {"new@c": 1.0}}}
    r = _run(tmp_path, base, new, "--modes", "w4a8", "--m", "1")
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "out.json").read_text())["timings"][key]
    assert t["1"] == {"old@a": 3.0, "both@b": 6.0, "new@c": 2.0} and t["2"] == {"old@a": 4.0}


def test_timings_of_the_other_regime_are_replaced_not_joined(tmp_path):
    """A sustained point (timed after the candidate ran for a while, meta.sustained_points) merged into a
    map that timed it in bursts replaces the base's timings there, and is marked sustained in the result."""
    base, new = _map("H100", "old"), _map("H100", "new")
    key = "w4a16:g128:64x64"
    base["timings"] = {key: {"1": {"old@a": 3.0}, "2": {"old@a": 4.0}}}
    new["timings"] = {key: {"1": {"new@c": 2.0}, "2": {"new@c": 5.0}}}
    new["meta"] = {"sustained_points": [f"{key} M=2"]}
    r = _run(tmp_path, base, new, "--modes", "w4a16", "--m", "1,2")
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["timings"][key] == {"1": {"old@a": 3.0, "new@c": 2.0}, "2": {"new@c": 5.0}}
    assert out["meta"]["sustained_points"] == [f"{key} M=2"]


def test_foreign_profiles_make_a_what_if_map_whose_points_hold_only_the_new_timings(tmp_path):
    """--foreign takes another GPU's profile (an A/B on a GPU that borrows the base's map): the base's device
    stays, the merged points' timings are the new GPU's alone (two GPUs' times do not compare), and meta.merged
    names the other device."""
    base, new = _map("H100", "old"), _map("H200", "new")
    key = "w4a16:g128:64x64"
    base["timings"] = {key: {"1": {"old@a": 3.0}, "2": {"old@a": 4.0}}}
    new["timings"] = {key: {"1": {"new@c": 2.0}}}
    r = _run(tmp_path, base, new, "--modes", "w4a16", "--m", "1", "--foreign")
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["device"] == "H100" and out["entries"][key]["1"]["strategy"] == "s_new"
    assert out["timings"][key] == {"1": {"new@c": 2.0}, "2": {"old@a": 4.0}}
    assert "profiled on H200" in out["meta"]["merged"][-1]
