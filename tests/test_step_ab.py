"""benchmarks/step_ab.py and decode_attention_chunks.py (CPU): their settings parsing; the timing
itself needs a GPU (`DecodeStepTimer`)."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
step_ab = pytest.importorskip("step_ab")
chunks = pytest.importorskip("decode_attention_chunks")


def test_sides_parse_switches_and_reject_mistakes():
    sides = step_ab.parse_sides(["sdpa=decode_attention_min_batch=3", "shipped=",
                                 "w=decode_attention_launch=off,small_trigger=wait"])
    assert sides == {"sdpa": {"decode_attention_min_batch": 3}, "shipped": {},
                     "w": {"decode_attention_launch": "off", "small_trigger": "wait"}}
    for bad, msg in ((["a=", "a="], "twice"), (["a="], "at least two"), (["a=", "noequals"], "LABEL=SWITCHES"),
                     (["a=", "b=nope=1"], "unknown switches")):
        with pytest.raises(SystemExit, match=msg):
            step_ab.parse_sides(bad)


def test_chunk_variants():
    assert chunks.variant("sdpa") == (3, {}, "rule")
    assert chunks.variant("k256") == (1, {}, "start")
    assert chunks.variant("k64off") == (1, {"chunk": 64, "block": 64}, "off")
    assert chunks.variant("k64s32loop") == (1, {"chunk": 64, "block": 64, "max_splits": 32}, "loop")
    with pytest.raises(SystemExit, match="unknown variant"):
        chunks.variant("k9")
