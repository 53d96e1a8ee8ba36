"""benchmarks/trigger_matrix.py (CPU): its argument parsing and per-round ratios; the timing itself
needs a GPU (`DecodeStepTimer`)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
trigger_matrix = pytest.importorskip("trigger_matrix")


def test_gemv_points_and_combinations():
    assert trigger_matrix.parse_gemv("rule,1,3") == [-1, 1, 3]
    with pytest.raises(SystemExit, match="'7'"):
        trigger_matrix.parse_gemv("rule,7")
    combos = trigger_matrix.combos([-1, 2], ["start", "wait"])
    assert [trigger_matrix.label(c) for c in combos] == ["gemv=rule,small=start", "gemv=rule,small=wait",
                                                         "gemv=2,small=start", "gemv=2,small=wait"]


def test_summary_takes_medians_and_per_round_ratios():
    out = trigger_matrix.summarize({"a": [2.0, 2.2, 2.1], "b": [1.9, 2.3, 1.995]}, "a")
    assert out["a"]["ratio"] == 1.0 and out["a"]["round_ratio"] == 1.0
    assert out["b"]["ms"] == 1.995 and out["b"]["ratio"] == pytest.approx(1.995 / 2.1)
    # per round: 0.95, 1.045, 0.95 -> median 0.95 (a drifting round does not move it)
    assert out["b"]["round_ratio"] == pytest.approx(0.95)


def test_bad_small_trigger_is_one_line_before_any_gpu_work():
    r = subprocess.run([sys.executable, str(BENCH / "trigger_matrix.py"), "--small", "start,end"],
                       capture_output=True, text=True, cwd=BENCH.parent,
                       env={"PYTHONPATH": str(BENCH.parent), "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"})
    assert r.returncode != 0 and "--small: unknown ['end']" in r.stderr and "Traceback" not in r.stderr


def test_ratio_table_lines_up_labels_and_cells():
    out = trigger_matrix.summarize({"a": [2.0, 2.1], "b": [1.9, 2.0]}, "a")
    lines = trigger_matrix.ratio_table("batch", {1: out, 16: out}, ["a", "b"]).splitlines()
    assert len(lines) == 3 and lines[0].split() == ["batch", "a", "b"]
    assert lines[2].split() == ["16", "2.050", "(1.000)", "1.950", "(0.951)"]
    assert len({len(line) for line in lines}) == 1


def test_alternate_reverses_the_order_every_other_round():
    calls = []
    times = trigger_matrix.alternate(["a", "b", "c"], 3, lambda label: calls.append(label) or float(len(calls)))
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert times == {"a": [1.0, 6.0, 7.0], "b": [2.0, 5.0, 8.0], "c": [3.0, 4.0, 9.0]}
