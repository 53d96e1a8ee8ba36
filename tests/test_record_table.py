"""benchmarks/record_table.py (CPU): the issue's table from a policy_ab record run, and
benchmarks/kernels.py's kernel_switches parser that policy_ab and step_search share."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
record_table = pytest.importorskip("record_table")
kernels_bench = pytest.importorskip("kernels")


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
