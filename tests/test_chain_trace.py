"""benchmarks/mma_ablations/chain_trace.py (CPU): the timeline it reads from per-program trace rows."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "mma_ablations"))
chain_trace = pytest.importorskip("chain_trace")

SHAPES = [("qkv", 64, 128), ("o", 32, 128)]


def launch(t0_ns: int, starts_ns: list, ends_ns: list, sms: list, wait_ns: int = 0) -> dict:
    rows = torch.zeros(len(starts_ns), 4, dtype=torch.int64)
    rows[:, 0] = t0_ns + torch.tensor(starts_ns)
    rows[:, 1] = t0_ns + wait_ns
    rows[:, 2] = t0_ns + torch.tensor(ends_ns)
    rows[:, 3] = torch.tensor(sms)
    return {"rows": rows, "tile": "t"}


def test_timeline_reads_overlap_spans_and_rates():
    """Four launches of two programs (SMs 0 and 1), each launch's first program starting 1 us before
    the previous launch's last program ends; 3 MB per launch."""
    launches = []
    t = 10_000_000
    for i in range(4):
        # programs on SM 0 and 1: start at 0 / 0.5 us, end at 3 / 3.5 us after t
        launches.append(launch(t, [0, 500], [3000, 3500], [0, 1], wait_ns=200))
        t += 2500  # the next launch's first program starts 1 us before this one's last end
    out = chain_trace.timeline(launches, SHAPES, [3e6, 3e6], copy_tbs=2.0, wait=True)
    per = out["launches"]
    assert per[0]["ramp"] == pytest.approx(0.5) and per[0]["drain"] == pytest.approx(0.5)
    for d in per[1:]:
        assert d["span"] == pytest.approx(2.5) and d["lead"] == pytest.approx(1.0)
        # both programs start before the previous launch's program on their SM ended (SM 0: 2.5 < 3.0,
        # SM 1: 3.0 < 3.5)
        assert d["early"] == pytest.approx(1.0)
        assert d["release"] == pytest.approx(0.2 - 1.0)
        assert d["dur_p50"] == pytest.approx(3.0)
    assert out["shapes"]["o"]["span"] == pytest.approx(2.5) and out["shapes"]["o"]["programs"] == 2
    # 4 launches x 3 MB over 11 us of step
    assert out["rate"]["mean_tbs"] == pytest.approx(4 * 3e6 / 11.0 / 1e6)
    assert 0.0 <= out["rate"]["below_50pct_of_copy"] <= out["rate"]["below_80pct_of_copy"] <= 1.0
