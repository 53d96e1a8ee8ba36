"""benchmarks/record_table.py (CPU): the issue's table from a policy_ab record run, and
benchmarks/kernel_bench.py's kernel_switches parser that policy_ab and step_search share."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
record_table = pytest.importorskip("record_table")
kernels_bench = pytest.importorskip("kernel_bench")


def _run(**over):
    run = {"device": "GPU", "preset": "llama3-8b", "a": "map.json", "b": "map.json", "set_a": "", "set_b": "",
           "mode": "w4a16", "int4_prog": False, "norm_codes": "", "weight_bytes": 3.0e9, "copy_bw_Bps": 3.0e12,
           "ms": {"16": {"a": 2.0, "b": 2.2, "runs": {"a": [2.0, 2.1, 1.9], "b": [2.2, 2.3, 2.4]},
                         "cublas_bf16": 5.0},
                  "1": {"a": 1.5, "b": 1.5, "runs": {"a": [1.5, 1.5], "b": [1.5, 1.6]}}}}
    return run | over


def test_rows_pool_both_sides_and_take_ratios_from_the_same_run():
    rows = record_table.rows(_run())
    assert [r["m"] for r in rows] == [1, 16]  # numeric order, not the JSON's
    r1, r16 = rows
    assert r1["floor_ms"] == pytest.approx(1.0)  # 3 GB at 3 TB/s
    assert r1["ms"] == pytest.approx(1.5) and r1["x_floor"] == pytest.approx(1.5)
    assert r16["ms"] == pytest.approx(2.15)  # median of the six runs of both sides
    assert r16["spread"] == (1.9, 2.4)
    assert r16["gbs"] == pytest.approx(3.0e9 / 2.15e-3 / 1e9)
    assert r16["x_bw"] == pytest.approx(1 / 2.15)
    flops = 2 * 16 * 32 * (6144 * 4096 + 4096 * 4096 + 28672 * 4096 + 4096 * 14336)
    assert r16["tflops"] == pytest.approx(flops / 2.15e-3 / 1e12)
    assert r16["x_peak"] == pytest.approx(r16["tflops"] / 989.0)
    assert r16["cublas"] == 5.0 and "cublas" not in r1
    md = record_table.markdown([_run()])
    assert "| 16 | 2.150 (1.900-2.400) | 2.15 |" in md and "2.33x" in md


def test_an_ab_run_or_an_old_record_is_refused():
    with pytest.raises(SystemExit, match="not a record run"):
        record_table.rows(_run(b="other.json"))
    with pytest.raises(SystemExit, match="not a record run"):
        record_table.rows(_run(set_b="int4_mma_gemv.TRIGGER=2"))
    old = _run()
    del old["copy_bw_Bps"]
    with pytest.raises(SystemExit, match="copy_bw_Bps"):
        record_table.rows(old)
    with pytest.raises(SystemExit, match="preset"):
        record_table.rows(_run(preset="other"))


def test_kernel_switches_parse_module_switches_and_refuse_unknown_ones():
    from gearshift.kernels import int4_mma_gemv

    out = kernels_bench.kernel_switches("int4_mma_gemv.TRIGGER=2")
    assert out == {(int4_mma_gemv, "TRIGGER"): 2} and isinstance(out[(int4_mma_gemv, "TRIGGER")], int)
    assert kernels_bench.kernel_switches("") == {}
    with pytest.raises(SystemExit, match="no switch"):
        kernels_bench.kernel_switches("int4_mma_gemv.NO_SUCH_SWITCH=1")
    engine = kernels_bench.kernel_switches("switches.tile_room=0")  # the engine's switches, set the same way
    (mod, attr), value = next(iter(engine.items()))
    assert attr == "tile_room" and value is False and getattr(mod, attr) is True
    from gearshift.kernels import switches

    try:
        setattr(mod, attr, value)
        assert not switches.tile_room_on()
    finally:
        switches.set_switches(tile_room=True)
    with pytest.raises(SystemExit, match="no switch"):
        kernels_bench.kernel_switches("switches.no_such_switch=1")


def test_map_table_reads_each_picks_profile_time_as_bandwidth_and_throughput():
    map_table = pytest.importorskip("map_table")
    from gearshift.dispatch.policy import PolicyMap

    pm = PolicyMap.from_json({"version": 1, "device": "GPU", "buckets": [1, 16], "meta": {},
                              "entries": {"w4a16:g128:4096x4096": {
                                  "1": {"strategy": "w4a16_mma", "config": {"bm": 16, "bn": 0, "bk": 128, "split_k": 1,
                                                                            "warps": 8, "stages": 1, "ksum": True},
                                        "us": 4.0},
                                  "16": {"strategy": "dequant_cublas", "config": None, "us": None}}}})
    rows = map_table.rows(pm, "w4a16", [("o", 4096, 4096), ("qkv", 6144, 4096)], [1, 16], copy_bw=3e12)
    assert len(rows) == 1  # no time at 16, no entry for qkv: left out
    r = rows[0]
    nbytes = 4096 * 4096 / 2 + 4 * 4096 * 32
    assert r["shape"] == "o" and r["tile"] == "w4a16_mma bm16 w8 ksum"
    assert r["gbs"] == pytest.approx(nbytes / 4e-6 / 1e9) and r["x_bw"] == pytest.approx(nbytes / 4e-6 / 3e12)
    assert r["tflops"] == pytest.approx(2 * 4096 * 4096 / 4e-6 / 1e12)
    assert "| o | 1 | w4a16_mma bm16 w8 ksum | 4.0 |" in map_table.markdown(pm, ["w4a16"], [("o", 4096, 4096)], [1],
                                                                            3e12, "m.json")


def test_bench_leaves_out_static_strategies_that_cannot_run_the_store():
    """kernel_bench.py's bench stage times a strategy forced alone only where it runs the store itself: the
    row-layout GEMV kernels on blocks16 weights would fall back to the torch reference (stop 46)."""
    from gearshift.dispatch.dispatcher import AdaptiveDispatcher
    from gearshift.dispatch.profiler import random_store
    from gearshift.dispatch.strategies import STRATEGIES

    st = random_store("int4", 256, 1024, 128, "cpu", layout="blocks16")

    def serves(name, m):
        return kernels_bench.static_serves(AdaptiveDispatcher(None, autoload=False, static=name), STRATEGIES[name],
                                           st, None, m)

    assert serves("w4a16_mma", 1) and serves("w4a16_tc", 64) and serves("dequant_cublas", 1)
    assert not serves("w4a16_rowgemv", 1) and not serves("w4a16_gemv", 1) and not serves("w4a16_wgmma", 1)


def test_producer_tiles_feed_the_linears_the_engine_feeds():
    """The benchmarks' x tiles go to every linear whose producer writes them in the engine (o's from decode
    attention too; stop 71: o had been left on rows) and follow `x_tiles_linears`, as QuantLinear.x_tiles_for."""
    import torch

    from gearshift.kernels import switches
    from gearshift.kernels.x_tiles import XTiles

    class Reads:  # a dispatcher whose kernel reads x tiles for every store at 16 tokens
        def x_tiles_for(self, store, act, m, dtype):
            return m == 16

    shapes = [("qkv", 6144, 128), ("o", 128, 128), ("gate_up", 256, 128), ("down", 128, 128)]
    xs = [torch.randn(16, k, dtype=torch.bfloat16) for _, _, k in shapes]
    fed = kernels_bench.producer_tiles(Reads(), shapes, [None] * 4, xs, None, 16)
    assert all(isinstance(t, XTiles) and torch.equal(t.rows(), x) for t, x in zip(fed, xs))
    assert kernels_bench.producer_tiles(Reads(), shapes, [None] * 4, [x[:4] for x in xs], None, 4)[1].shape == (4, 128)
    before = switches.state()
    try:
        switches.set_switches(x_tiles_linears="qkv+down")
        fed = kernels_bench.producer_tiles(Reads(), shapes, [None] * 4, xs, None, 16)
        assert [isinstance(t, XTiles) for t in fed] == [True, False, False, True]
    finally:
        switches.set_switches(**dict(before))


def test_bucket_shift_writes_a_map_whose_bucket_runs_another_buckets_picks(tmp_path, monkeypatch):
    """benchmarks/bucket_shift.py (stop 71's what-if maps): bucket 32 takes bucket 16's picks, other buckets and
    modes stay, and the timings are dropped."""
    bucket_shift = pytest.importorskip("bucket_shift")
    from gearshift.dispatch.policy import PolicyMap

    src = Path(__file__).resolve().parents[1] / "gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json"
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bucket_shift.py", "--map", str(src), "--take", "16", "--into", "32",
                                      "--modes", "w4a16", "--out", str(out)])
    bucket_shift.main()
    before, after = PolicyMap.load(src), PolicyMap.load(out)
    i16, i32 = before.buckets.index(16), before.buckets.index(32)
    for key, row in after.entries.items():
        if key.startswith("w4a16:") and before.entries[key][i16] is not None:
            assert row[i32].to_dict() == before.entries[key][i16].to_dict()
            assert row[i16].to_dict() == before.entries[key][i16].to_dict()
        else:
            assert [c and c.to_dict() for c in row] == [c and c.to_dict() for c in before.entries[key]]
    assert after.timings == {}
    monkeypatch.setattr(sys, "argv", ["bucket_shift.py", "--map", str(src), "--take", "3", "--into", "32",
                                      "--out", str(out)])
    with pytest.raises(SystemExit, match="buckets of the map"):
        bucket_shift.main()
