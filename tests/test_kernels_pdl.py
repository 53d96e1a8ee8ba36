"""Programmatic dependent launch (kernels/pdl.py): the switch, and the contract that a PDL kernel
reads nothing an earlier kernel writes before griddepcontrol.wait.

On CPU the kernels are compiled for sm_90 (Triton ships ptxas) and their PTX is read: every load of
an input that a previous kernel produces must come after the wait. On a GPU, PDL and plain
launches must give bit-identical results, also inside a CUDA graph."""

import re

import pytest
import torch

from gearshift.kernels import pdl
from gearshift.kernels.int4_mma_gemv import pdl_trigger


def test_switch_and_cpu():
    x = torch.zeros(4)
    assert not pdl.pdl_enabled(x) and not pdl.l2_prefetch_enabled(x)
    assert pdl.launch_kwargs(False) == {} and pdl.launch_kwargs(True) == {"launch_pdl": True}
    try:
        pdl.set_pdl(False)
        assert not pdl._STATE["pdl"]
    finally:
        pdl.set_pdl(True)
    # the L2 switch is a module attribute, so policy_ab.py --set-b pdl.L2_PREFETCH=1 reaches it
    before = pdl.L2_PREFETCH
    try:
        pdl.set_l2_prefetch(True)
        assert pdl.L2_PREFETCH is True and not pdl.l2_prefetch_enabled(x)  # (never on CPU)
    finally:
        pdl.set_l2_prefetch(before)
    # bf16 inputs: the start to 4 tokens, after the loop to 12, right after the wait to 16 (stop 45)
    assert [pdl_trigger(m) for m in (1, 2, 3, 4, 5, 8, 9, 12, 13, 16, 17)] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 0]
    # activation codes (W4A8 / W4A4 / fp8) keep the exit trigger from 5 tokens (stop 43: even end to end)
    assert [pdl_trigger(m, codes=True) for m in (1, 2, 4, 5, 8, 16)] == [1, 1, 2, 0, 0, 0]


_COMPILE = r"""
from gearshift.kernels import int4_mma_gemv as mg
from gearshift.kernels.rmsnorm import _rms_norm_kernel

sig = dict(x_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", q_ptr="*i8", qs_ptr="*fp32", M="i32", D="i32",
           stride_x="i32", stride_y="i32", stride_q="i32", eps="fp32")
for on in (True, False):
    out[f"rms{int(on)}"] = ptx(_rms_norm_kernel, sig, dict(BD=1024, PDL=on, QMAX=0.0))
out["rms_codes"] = ptx(_rms_norm_kernel, sig, dict(BD=1024, PDL=True, QMAX=127.0))
out["rms_late"] = ptx(_rms_norm_kernel, sig, dict(BD=1024, PDL=2, QMAX=0.0))
sig = dict(x_ptr="*bf16", qw_ptr="*u8", s_ptr="*bf16", mn_ptr="*bf16", y_ptr="*bf16", ws_ptr="*fp32",
           cnt_ptr="*i32", xs_ptr="*fp32", M="i32", N="i32", K="i32", stride_xm="i32", stride_ym="i32")
for trig in (0, 1, 2, 3):
    out[f"mma{trig}"] = ptx(mg._mma_gemv_kernel, sig, dict(
        G=128, WARPS=4, SPLIT_K=2, ASM=mg.MMA_ASM[("bf16", 16, 1)], CONSTRAINTS=mg.CONSTRAINTS[(16, 1)],
        ROWS=16, TILES=1, TG=1, ZPID=True, OFFSET=128.0, U=1, HAS_XS=False, PDL=True, L2_PREFETCH=False, TRIGGER=trig,
        LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=False, TAIL=0, KWARPS=1))
out["mma_pre"] = ptx(mg._mma_gemv_kernel, sig, dict(
    G=128, WARPS=8, SPLIT_K=1, ASM=mg.MMA_ASM[("bf16", 16, 1)], CONSTRAINTS=mg.CONSTRAINTS[(16, 1)],
    ROWS=16, TILES=1, TG=1, ZPID=True, OFFSET=128.0, U=1, HAS_XS=False, PDL=True, L2_PREFETCH=False, TRIGGER=1,
    LOAD=mg.WEIGHT_LOADS["plain"], SHINT=0, TILED=True, TAIL=0, KWARPS=4, PRE=4), num_warps=8)
"""


@pytest.fixture(scope="module")
def ptx(compile_sm90):
    """PTX of the PDL kernels compiled for sm_90."""
    return compile_sm90(_COMPILE)


def _first(ptx: str, pattern: str) -> int:
    m = re.search(pattern, ptx)
    return m.start() if m else -1


def test_rmsnorm_waits_before_loading(ptx):
    wait, dep, load = (_first(ptx["rms1"], p) for p in (r"griddepcontrol\.wait",
                                                         r"griddepcontrol\.launch_dependents", r"ld\.global"))
    assert 0 <= dep < wait < load
    assert "griddepcontrol" not in ptx["rms0"]
    # emitting the next linear's codes adds their stores (int8 codes, one fp32 scale), after the wait
    codes = ptx["rms_codes"]
    assert _first(codes, r"griddepcontrol\.wait") < _first(codes, r"st\.global\.b8|st\.global\.v\d\.b8|st\.global\.b32")
    assert "st.global" in codes and len(re.findall(r"st\.global", codes)) > len(re.findall(r"st\.global", ptx["rms1"]))
    # small_trigger "wait": the successor is let in only once this kernel has passed its own wait
    wait, dep, load = (_first(ptx["rms_late"], p) for p in (r"griddepcontrol\.wait",
                                                             r"griddepcontrol\.launch_dependents", r"ld\.global"))
    assert 0 <= wait < dep and wait < load


def test_small_trigger_switch():
    from gearshift.kernels import switches

    assert switches.small_trigger() == "start"  # outside a forward pass, under the rule
    assert pdl.small_pdl(False) == 0 and pdl.small_pdl(True) == 1
    # the rule: at their start only for 1-2 tokens on bf16 inputs (stop 45, trigger_matrix.py)
    assert [switches.small_trigger_rule(r, False) for r in (1, 2, 3, 16, 512)] == ["start", "start", "wait", "wait", "wait"]
    assert [switches.small_trigger_rule(r, True) for r in (1, 2, 16)] == ["wait"] * 3
    with switches.pdl_pass(4, codes=False):
        assert switches.small_trigger() == "wait" and pdl.small_pdl(True) == 2
        with switches.pdl_pass(1, codes=False):
            assert pdl.small_pdl(True) == 1
        assert pdl.small_pdl(True) == 2
    assert switches.small_trigger() == "start"
    try:
        switches.set_small_trigger("wait")
        assert pdl.small_pdl(True) == 2 and pdl.small_pdl(False) == 0
        with switches.pdl_pass(1, codes=False):  # a fixed setting overrides the rule
            assert switches.small_trigger() == "wait"
        assert ("small_trigger", "wait") in switches.state()
    finally:
        switches.set_small_trigger("rule")
    for bad in (lambda: switches.set_small_trigger("end"), lambda: switches.set_switches(small_trigger="end")):
        with pytest.raises(ValueError, match="small_trigger"):
            bad()
    assert switches.small_trigger() == "start"


@pytest.mark.parametrize("trigger", [0, 1, 2, 3])
def test_mma_gemv_reads_only_weights_before_the_wait(ptx, trigger):
    text = ptx[f"mma{trigger}"]
    wait = _first(text, r"griddepcontrol\.wait")
    assert wait > 0
    before = text[:wait]
    # weights (ld.global.nc) and scales may be read early; x (plain ld.global in the MMA asm), the
    # split-K workspace and counters, and every store only after the wait
    assert not re.search(r"ld\.global\.v4\.b32|st\.global|atom\.", before)
    assert "ld.global.nc.L1::no_allocate.v4.b32" in before
    dep = _first(text, r"griddepcontrol\.launch_dependents")
    if trigger == 0:
        assert dep == -1
    elif trigger == 1:
        assert 0 <= dep < wait
    elif trigger == 3:  # right after the wait, before the first MMA
        assert wait < dep < text.find("mma.sync")
    else:  # after the main loop: past the last MMA
        assert dep > text.rfind("mma.sync")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_pdl_matches_plain_in_a_graph():
    from gearshift.kernels.config import TileConfig
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_gemv_quantized
    from gearshift.kernels.rmsnorm import rms_norm_triton
    from gearshift.quant.activations import ActQuantSpec
    from gearshift.quant.int4 import quantize_int4

    if not pdl.pdl_enabled(torch.zeros(1, device="cuda")):
        pytest.skip("no PDL on this GPU / Triton")
    torch.manual_seed(0)
    store = quantize_int4(torch.randn(1024, 1024), 128).cuda()
    w = torch.rand(1024, device="cuda", dtype=torch.bfloat16) + 0.5
    x = torch.randn(3, 1024, device="cuda", dtype=torch.bfloat16)
    cfg = TileConfig(16, 0, 128, 4, 4, 1)

    def chain():
        h = x
        for i in range(6):
            h = rms_norm_triton(h, w, 1e-5)
            h = (mma_gemv(h, store, cfg, trigger=i % 3) if i % 2 else
                 mma_gemv_quantized(h, store, ActQuantSpec("int8"), cfg)) + x
        return h

    pdl.set_pdl(False)
    try:
        ref = chain()
    finally:
        pdl.set_pdl(True)
    assert torch.equal(chain(), ref)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        chain()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = chain()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


def test_mma_gemv_preload_issues_the_whole_slice_before_the_wait(ptx):
    """PRE = 4 blocks: all 4 x 2 row loads of the warp's slice (and nothing else global) before the
    wait, the 4 blocks' MMAs after it, and no loop left."""
    text = ptx["mma_pre"]
    wait = _first(text, r"griddepcontrol\.wait")
    before, after = text[:wait], text[wait:]
    assert before.count("ld.global.nc.L1::no_allocate.v4.b32") == 8
    assert "ld.global.nc.L1::no_allocate.v4.b32" not in after
    assert not re.search(r"ld\.global\.v4\.b32|st\.global|atom\.", before)
    assert after.count("mma.sync") == 4 * 16 and "mma.sync" not in before


def test_tile_trigger_reaches_the_launch(monkeypatch):
    """A tile's own trigger point (TileConfig.trigger, chosen per shape by `step_search.py --triggers`)
    replaces the rule by M; the experiment overrides (module TRIGGER, the gemv_trigger switch) still win."""
    from gearshift.kernels import int4_mma_gemv as mg
    from gearshift.kernels.config import TileConfig
    from gearshift.quant.int4 import quantize_int4

    seen = []

    class _Stop(Exception):
        pass

    class _Kernel:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(kw["TRIGGER"])
                raise _Stop
            return launch

    monkeypatch.setattr(mg, "_mma_gemv_kernel", _Kernel())
    store = quantize_int4(torch.randn(64, 256), 128)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    for cfg in (TileConfig(bm=16, warps=4, stages=1), TileConfig(bm=16, warps=4, stages=1, trigger=3)):
        with pytest.raises(_Stop):
            mg.mma_gemv(x, store, cfg)
    monkeypatch.setattr(mg, "TRIGGER", 0)
    with pytest.raises(_Stop):
        mg.mma_gemv(x, store, TileConfig(bm=16, warps=4, stages=1, trigger=3))
    assert seen == [pdl_trigger(4), 3, 0]
