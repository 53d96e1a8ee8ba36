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


def test_forward_pass_resolves_the_small_trigger(monkeypatch):
    """The model resolves the small kernels' PDL trigger once per forward pass, from its rows and
    whether its mode's linears take activation codes (`small_trigger_rule`), and restores it after."""
    import torch

    from gearshift.model import transformer
    from gearshift.model.tiny import build_random_model

    seen = []

    class Recorder(switches.small_trigger_pass):
        def __enter__(self):
            seen.append((self.where, switches.small_trigger()))
            out = super().__enter__()
            seen[-1] += (switches.small_trigger(),)
            return out

    monkeypatch.setattr(transformer, "small_trigger_pass", Recorder)
    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cpu", dtype=torch.float32)
    for mode, b, t in (("w4a16", 1, 1), ("w4a16", 2, 2), ("w4a8", 1, 1)):
        cache = model.new_cache(b, 8)
        model(torch.randint(0, 512, (b, t)), cache, [0] * b, [t] * b, mode=mode)
    # (resolved, before the pass, inside it): 1 and 4 rows on bf16 inputs, 1 row on codes
    assert seen == [("start", "start", "start"), ("wait", "start", "wait"), ("wait", "start", "wait")]
    assert switches.small_trigger() == "start"
