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
    """The model resolves the small kernels' PDL trigger and decode attention's launch point once per
    forward pass, from its rows and whether its mode's linears take activation codes
    (`small_trigger_rule`, `decode_attention_launch_rule`), and restores them after."""
    import torch

    from gearshift.model import transformer
    from gearshift.model.tiny import build_random_model

    seen = []

    class Recorder(switches.pdl_pass):
        def __enter__(self):
            seen.append((self.small, switches.small_trigger()))
            out = super().__enter__()
            seen[-1] += (switches.small_trigger(), switches.attention_launch(64))
            return out

    monkeypatch.setattr(transformer, "pdl_pass", Recorder)
    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cpu", dtype=torch.float32)
    for mode, b, t in (("w4a16", 1, 1), ("w4a16", 2, 2), ("w4a8", 1, 1)):
        cache = model.new_cache(b, 8)
        model(torch.randint(0, 512, (b, t)), cache, [0] * b, [t] * b, mode=mode)
    # (resolved, before the pass, inside it, attention inside it): 1 and 4 rows on bf16 inputs, 1 row on codes
    assert seen == [("start", "start", "start", "off"), ("wait", "start", "wait", "start"),
                    ("wait", "start", "wait", "start")]
    assert switches.small_trigger() == "start" and switches.attention_launch(1) == "off"


def test_decode_attention_launch_rule_and_override():
    """Decode attention runs from one sequence and lets o in without PDL at 1-2 rows on bf16 inputs,
    else at its start (stop 46); the switch overrides the rule for every launch and rejects unknown points."""
    before = switches.state()
    try:
        assert switches.decode_attention_min_batch() == 1
        assert [switches.decode_attention_launch(r) for r in (1, 2, 3, 4, 64)] == ["off", "off"] + ["start"] * 3
        assert [switches.decode_attention_launch(r, codes=True) for r in (1, 2, 3)] == ["start"] * 3
        switches.set_switches(decode_attention_launch="loop", decode_attention_min_batch="3")
        assert switches.decode_attention_launch(1) == "loop" and switches.decode_attention_min_batch() == 3
        with pytest.raises(ValueError, match="decode_attention_launch must be one of"):
            switches.set_switches(decode_attention_launch="early")
    finally:
        switches.set_switches(**dict(before))


def test_norm_warps_rule_and_override():
    """An RMSNorm program takes 8 warps from 4096 columns and 4 below (stop 50: 4096-wide rows with 8 warps
    timed 0.993-1.001 of 4 on the H100's decode steps and 256-token passes); the switches override the rule,
    separately for the norms that also emit codes, and 0 gives the rule back."""
    from gearshift.kernels.rmsnorm import _warps

    before = switches.state()
    try:
        for codes in (False, True):
            assert [_warps(bd, codes) for bd in (64, 1024, 2048, 4096, 8192)] == [4, 4, 4, 8, 8]
        switches.set_switches(norm_codes_warps="16")
        assert _warps(4096, True) == 16 and _warps(1024, True) == 16 and _warps(4096, False) == 8
        switches.set_switches(norm_warps=2, norm_codes_warps=0)
        assert _warps(4096, False) == 2 and _warps(4096, True) == 8
    finally:
        switches.set_switches(**dict(before))
    assert _warps(1024, False) == 4


def test_x_tiles_rule_and_overrides():
    """The producers write x tiles from one token up to the layout's 16, for all four linears; the switches
    move the start and leave linears out, and reject names they do not know. Where a pass of 1-2 rows writes
    them, the small kernels let their successor in after their wait and decode attention at its start (stop 66)."""
    before = switches.state()
    try:
        assert [switches.x_tiles_on(m) for m in (1, 2, 3, 16, 17)] == [True] * 4 + [False]
        assert all(switches.x_tiles_on(1, n) for n in switches.X_TILE_LINEARS)
        assert [switches.small_trigger_rule(r, False, True) for r in (1, 2, 3)] == ["wait"] * 3
        assert [switches.small_trigger_rule(r, False) for r in (1, 2, 3)] == ["start", "start", "wait"]
        assert [switches.decode_attention_launch(r, tiles=True) for r in (1, 2, 3)] == ["start"] * 3
        assert switches.pdl_pass(1, False, tiles=True).attention == "start"
        assert (switches.pdl_pass(2, False).small, switches.pdl_pass(2, False).attention) == ("start", "off")
        switches.set_switches(x_tiles_from=3)
        assert [switches.x_tiles_on(m) for m in (1, 2, 3)] == [False, False, True]
        switches.set_switches(x_tiles_from=1, x_tiles_linears="o+down")
        assert switches.x_tiles_on(1, "o") and switches.x_tiles_on(2, "down") and switches.x_tiles_on(1)
        assert not switches.x_tiles_on(4, "qkv") and not switches.x_tiles_on(4, "gate_up")
        switches.set_switches(x_tiles=False)
        assert not switches.x_tiles_on(4, "o")
        with pytest.raises(ValueError, match="x_tiles_linears"):
            switches.set_switches(x_tiles_linears="qkv+up")
    finally:
        switches.set_switches(**dict(before))


def test_group_index_rule_and_overrides(monkeypatch):
    """The fragment GEMV divides the scale group index unsigned only for 16-bit inputs in one token tile without
    codes or dequantize-first (stop 70's H200 steps); the switch and the module's experiment knob override it."""
    from gearshift.kernels import int4_mma_gemv as mg

    rule = {(t, c, d): mg.group_signed(t, c, d) for t in (1, 2) for c in (False, True) for d in (False, True)}
    assert [k for k, v in rule.items() if v == 0] == [(1, False, False)]
    before = switches.state()
    try:
        switches.set_switches(group_index="signed")
        assert {mg.group_signed(*k) for k in rule} == {1}
        switches.set_switches(group_index="unsigned")
        assert {mg.group_signed(*k) for k in rule} == {0}
        monkeypatch.setattr(mg, "GROUP_SIGNED", 1)
        assert mg.group_signed(1, False, False) == 1
        with pytest.raises(ValueError, match="group_index must be one of"):
            switches.set_switches(group_index="fast")
    finally:
        switches.set_switches(**dict(before))
    assert switches.state() == before
