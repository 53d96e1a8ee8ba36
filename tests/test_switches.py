"""kernels/switches.py: named switches, the graph key, and the fragment GEMV's PDL trigger override."""
import pytest

from gearshift.kernels import switches
from gearshift.kernels.int4_mma_gemv import pdl_trigger


def test_set_switches_casts_keys_graphs_and_rejects_unknown_names():
    before = switches.state()
    try:
        switches.set_switches(gemv_trigger="3", decode_attention=0)
        assert switches.gemv_trigger() == 3 and switches.decode_attention_on() is False
        assert switches.state() != before and hash(switches.state()) is not None
        with pytest.raises(ValueError, match="unknown switches"):
            switches.set_switches(no_such_switch=1)
    finally:
        switches.set_switches(**dict(before))
    assert switches.state() == before


def test_gemv_trigger_defaults_to_the_rule():
    assert switches.gemv_trigger() == -1
    assert [pdl_trigger(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 64)] == [1, 1, 1, 1, 2, 2, 2, 3, 0]
    assert [pdl_trigger(m, codes=True) for m in (1, 2, 3, 4, 5, 16)] == [1, 1, 2, 2, 0, 0]
