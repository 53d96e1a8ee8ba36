"""Int4 stores with row units (`quantize_int4_progressive`) and the int8-weight W4A8 / W4A4 Gluon
kernel that reads them (`kernels/w4a8_progressive.py`).

On CPU: the quantizer's exactness and error, the store's checks, the kernel's torch model against
the reference, the support rules, and an sm_90 compile (which also proves the doubled-byte tile's
layout is the int8 wgmma A fragment). On a Hopper GPU: the kernel against its model, bit for bit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gearshift.dispatch.profiler import random_store
from gearshift.kernels.act_quant import quantize_act_reference
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.w4a8_progressive import (HAS_GLUON, progressive_configs, progressive_supports,
                                                w4a8_progressive_emulate)
from gearshift.model.quant_linear import concat_rows
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import BLOCKS16, ROWS, Int4Weight, quantize_int4, quantize_int4_progressive

from hopper import needs_hopper  # tests/hopper.py


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("dist", ["normal", "heavy", "tiny"])
def test_progressive_groups_are_exact_int8_multiples(dist):
    torch.manual_seed(0)
    w = {"normal": torch.randn(128, 1024), "heavy": torch.distributions.StudentT(3).sample((128, 1024)),
         "tiny": torch.randn(128, 1024) * 1e-6}[dist]
    st = quantize_int4_progressive(w, 128)
    w8 = st.int8_weights()
    assert w8.dtype == torch.int8 and int(w8.abs().max()) <= 127
    mant, _ = torch.frexp(st.row_units)
    assert bool((mant == 0.5).all())
    # the fp16 scales and mins hold t * unit and -tz * unit exactly: every kernel reads the same weights
    assert torch.equal(st.dequantize(), w8.float() * st.row_units[:, None])
    # a little more error than plain round-to-nearest (the group scale is a whole number of units)
    assert _rel(st.dequantize(), w) < 1.1 * _rel(quantize_int4(w, 128).dequantize(), w)


def test_row_units_are_checked_and_travel_with_the_store():
    st = quantize_int4_progressive(torch.randn(64, 512), 128)
    with pytest.raises(ValueError, match="powers of two"):
        Int4Weight(st.qweight, st.scales, st.mins, 128, row_units=st.row_units * 3)
    with pytest.raises(ValueError, match="not exact int8 multiples"):
        Int4Weight(st.qweight, st.scales, st.mins, 128, row_units=st.row_units * 2)
    b16 = st.to_layout(BLOCKS16)
    assert b16.row_units is st.row_units and torch.equal(b16.int8_weights(), st.int8_weights())
    back = Int4Weight.from_state(dict(b16.named_buffers()), b16.meta())
    assert back.meta()["row_units"] and torch.equal(back.dequantize(), st.dequantize())
    both = concat_rows([st, quantize_int4_progressive(torch.randn(32, 512), 128)])
    assert both.row_units.shape == (96,) and both.out_features == 96
    assert quantize_int4(torch.randn(8, 128)).row_units is None


def test_loader_quantizes_int4_prog():
    from gearshift.model.loader import WEIGHT_QUANTIZERS, quantize_store

    assert "int4-prog" in WEIGHT_QUANTIZERS
    st = quantize_store(torch.randn(32, 256), "int4-prog", 128)
    assert isinstance(st, Int4Weight) and st.row_units is not None


@pytest.mark.parametrize("act_dtype", ["int8", "int4"])
@pytest.mark.parametrize("split_k", [1, 2])
def test_emulation_is_the_reference(act_dtype, split_k):
    torch.manual_seed(0)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4p", 96, 1024, 128, "cpu")
    x = torch.randn(37, 1024)
    codes, scales = quantize_act_reference(x, act)
    emu = w4a8_progressive_emulate(codes, scales, st, torch.float32, split_k)
    ref = linear_reference(x, st, act)
    assert _rel(emu, ref) < 1e-5  # the same products, summed in another order


@pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")
def test_support_rules():
    prog = random_store("int4p", 256, 1024, 128, "cpu")
    cfgs = progressive_configs(256)
    assert cfgs and all(progressive_supports(prog, ActQuantSpec("int8"), c) for c in cfgs)
    c = cfgs[0]
    assert progressive_supports(prog, ActQuantSpec("int4"), c)
    assert not progressive_supports(random_store("int4", 256, 1024, 128, "cpu"), ActQuantSpec("int8"), c)
    assert not progressive_supports(prog, ActQuantSpec("fp8"), c)  # e4m3 codes are not integers
    assert not progressive_supports(prog, ActQuantSpec("int8", group_size=32), c)
    assert not progressive_supports(prog, None, c)
    assert progressive_configs(32) == []


def test_k_split_tiles_are_two_consumers_of_at_most_128_tokens():
    """kwarps = 2 (two consumer warpgroups over the same rows): 8 warps, BM <= 128, plain launches; each consumer
    must fit as a one-consumer tile, and the int32 hand-over counts in the shared memory."""
    from gearshift.kernels.w4a8_progressive import smem_bytes

    prog, act = random_store("int4p", 256, 1024, 128, "cpu"), ActQuantSpec("int8")
    split = [c for c in progressive_configs(128) if c.kwarps == 2]
    assert split and all(progressive_supports(prog, act, c) for c in split)
    ok = TileConfig(64, 64, 128, 1, 8, 6, kwarps=2)
    assert progressive_supports(prog, act, ok)
    assert smem_bytes(ok) == smem_bytes(TileConfig(64, 64, 128, 1, 8, 6)) + 4 * 64 * 64
    for bad in (replace(ok, warps=4), replace(ok, bm=256), replace(ok, stream_k=1), replace(ok, kwarps=4),
                replace(ok, bn=256)):
        assert not progressive_supports(prog, act, bad), bad


_COMPILE = r"""
import torch
from triton.runtime.jit import mangle_type
from triton.experimental.gluon._runtime import GluonASTSource
from gearshift.dispatch.profiler import random_store
from gearshift.kernels import w4a8_progressive as P
from gearshift.kernels import w4a8_wgmma as W
from gearshift.kernels.w4a16_wgmma import _weight_descriptor

def gluon_ptx(bm, bn, warps, stages, layout, maxnreg=None, split_k=1, consumers=1, ablate=0, stream_k=False,
              pdl=False, vec=False, ksplit=False):
    st = random_store("int4p", 4096, 4096, 128, "cpu", layout=layout)
    xd = W._code_descriptor(torch.empty(bm, 4096, dtype=torch.int8), bm, 128)
    wd = _weight_descriptor(st, bn, 128, swizzle=64)
    sd, md = W.group_descriptors(st, bn)
    sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "sc_desc": mangle_type(sd),
           "mn_desc": mangle_type(md), "units_ptr": "*fp32", "xs_ptr": "*fp32", "y_ptr": "*bf16",
           "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "per": "i32",
           "dpt": "i32"}
    # (the pointers 16-byte aligned, as launches from torch allocations specialize them)
    attrs = {(list(sig).index(n),): [["tt.divisibility", 16]] for n in ("units_ptr", "xs_ptr", "y_ptr", "N", "K")}
    cx = {"G": 128, "BN": bn, "STAGES": stages, "BLOCKS": layout == "blocks16", "SPLIT_K": split_k,
          "CONSUMERS": consumers, "num_warps": warps, "ABLATE": ablate, "STREAM_K": stream_k, "CMAX": 3, "PDL": pdl,
          "VEC_STORE": vec, "KSPLIT": ksplit}
    sig.update({name: "constexpr" for name in cx})
    names = list(sig)
    src = GluonASTSource(fn=P.w4a8_progressive_kernel, signature=sig,
                         constexprs={(names.index(k),): v for k, v in cx.items()}, attrs=attrs)
    opts = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]

out["one_consumer_blocks16"] = gluon_ptx(128, 64, 4, 4, "blocks16", 168)
out["two_consumers_rows_splitk"] = gluon_ptx(128, 128, 4, 4, "rows", 168, 2, 2)
# per K tile and consumer: BM = 256 and 128 rows per consumer (BN = 256) each issue twice the wgmmas
out["bm128_bn128"] = gluon_ptx(128, 128, 4, 3, "blocks16", None, 1, 2)
out["bm256_bn128_splitk"] = gluon_ptx(256, 128, 4, 3, "blocks16", None, 2, 2)
out["bm128_bn256"] = gluon_ptx(128, 256, 4, 3, "blocks16", None, 1, 2)
# the timing ablations of tc_ablations/progressive_parts.py
out["ablate3"] = gluon_ptx(128, 64, 4, 4, "blocks16", 168, ablate=3)
out["ablate7"] = gluon_ptx(128, 64, 4, 4, "blocks16", 168, ablate=7)
out["ablate15"] = gluon_ptx(64, 64, 4, 6, "blocks16", 128, ablate=15)
out["ablate63"] = gluon_ptx(64, 64, 4, 6, "blocks16", 128, ablate=63)
# two consumers over the same 128 rows, every other K tile each (kwarps = 2), whole and split-K
out["ksplit_bm128_bn128"] = gluon_ptx(128, 128, 4, 3, "blocks16", None, 1, 2, ksplit=True)
out["ksplit_bm128_bn64_splitk"] = gluon_ptx(128, 64, 4, 4, "blocks16", None, 2, 2, ksplit=True)
# stream-K: a persistent grid whose partial tiles meet behind acq_rel counters
out["stream_k_bm256_bn128"] = gluon_ptx(256, 128, 4, 3, "blocks16", None, 1, 2, stream_k=True)
out["stream_k_one_consumer"] = gluon_ptx(128, 64, 4, 4, "rows", 168, stream_k=True)
# programmatic dependent launch
out["pdl_two_consumers_splitk"] = gluon_ptx(128, 128, 4, 4, "blocks16", 168, 2, 2, pdl=True)
out["pdl_stream_k"] = gluon_ptx(256, 128, 4, 3, "blocks16", None, 1, 2, stream_k=True, pdl=True)
# the finished tiles through store_rows (16-byte stores), two token halves and one
out["vec_bm256_bn128"] = gluon_ptx(256, 128, 4, 3, "blocks16", 168, 1, 2, vec=True)
out["vec_bm128_bn256"] = gluon_ptx(128, 256, 4, 3, "blocks16", 168, 1, 2, vec=True)
"""


@pytest.fixture(scope="module")
def gluon_ptx(compile_sm90):
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    return compile_sm90(_COMPILE)


_WORD_VIEW = r"""
import ast, contextlib, io, re
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

# Triton 3.6 (the GPU machine's) has to_linear_layout for register layouts only and aborts on a
# shared one; there the kernel's bit-for-bit GPU test covers the word view instead
if not hasattr(gl, "to_linear_layout") or not hasattr(gl.shared_memory_descriptor, "reinterpret"):
    print("this Triton cannot map shared layouts to linear layouts", file=sys.stderr)
    raise SystemExit(3)

# a jit function needs a source file
PROBE = (
    "from triton.experimental import gluon\n"
    "from triton.experimental.gluon import language as gl\n"
    "from gearshift.kernels.w4a8_progressive import as_words\n"
    "@gluon.jit\n"
    "def k(x, BN: gl.constexpr, BKH: gl.constexpr, SW: gl.constexpr, RANK: gl.constexpr):\n"
    "    L8: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SW, element_bitwidth=8, rank=RANK)\n"
    "    L32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SW, element_bitwidth=32, rank=2)\n"
    "    if RANK == 3:  # the blocks16 TMA box, viewed as 2-D as the kernels do\n"
    "        buf = gl.allocate_shared_memory(gl.uint8, [BN // 16, 16, BKH], L8).reshape([BN, BKH])\n"
    "    else:\n"
    "        buf = gl.allocate_shared_memory(gl.uint8, [BN, BKH], L8)\n"
    "    gl.static_print('L8', gl.to_linear_layout(buf.type.layout, [BN, BKH]))\n"
    "    w = as_words(buf, BN, BKH // 4, L32)\n"
    "    gl.static_print('L32', gl.to_linear_layout(w.type.layout, [BN, BKH // 4]))\n")
import importlib.util, os, tempfile
# the layouts are printed while the kernel is traced: never take it from Triton's cache
os.environ["TRITON_ALWAYS_COMPILE"] = "1"
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
path = os.path.join(tempfile.mkdtemp(), "word_view_probe.py")
open(path, "w").write(PROBE)
spec = importlib.util.spec_from_file_location("word_view_probe", path)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
k = probe.k

def offsets(bases):
    tab = {}
    for off in range(1 << len(bases)):
        r = c = 0
        for i, (br, bc) in enumerate(bases):
            if off >> i & 1:
                r, c = r ^ br, c ^ bc
        tab[(r, c)] = off
    return tab

for BN, BKH, SW, RANK in [(64, 64, 64, 2), (64, 64, 64, 3), (64, 32, 32, 2), (64, 32, 32, 3), (128, 64, 64, 3)]:
    sig = {"x": "*i32", "BN": "constexpr", "BKH": "constexpr", "SW": "constexpr", "RANK": "constexpr"}
    src = GluonASTSource(fn=k, signature=sig, constexprs={(1,): BN, (2,): BKH, (3,): SW, (4,): RANK}, attrs={})
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        except Exception:
            pass  # the prints happen while the kernel is traced
    text = buf.getvalue()
    l8 = offsets(ast.literal_eval(re.search(r"L8.*?offset_bases=(\[\[.*?\]\])", text).group(1)))
    l32 = offsets(ast.literal_eval(re.search(r"L32.*?offset_bases=(\[\[.*?\]\])", text).group(1)))
    out[f"{BN}x{BKH} sw{SW} rank{RANK}"] = all(l8[(r, 4 * u)] == 4 * l32[(r, u)]
                                               for r in range(BN) for u in range(BKH // 4))
"""


@pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")
def test_word_view_of_the_swizzled_byte_tile_has_the_same_addresses(compile_sm90):
    """The kernel reads the TMA-swizzled byte tile as int32 words (`as_words`): word (r, u) must sit
    at the address of byte (r, 4u), for both byte orders' boxes and both swizzle widths."""
    res = compile_sm90(_WORD_VIEW)
    assert res and all(res.values()), res


def test_wide_tiles_issue_two_wgmmas_per_k_step(gluon_ptx):
    """BM = 256: two m64n128k32 wgmmas on the same weights per K step (Triton lowers no int8
    n256); BN = 256: two m64 row blocks per consumer. Both twice the BM = BN = 128 tile's count."""
    def count(name):
        return gluon_ptx[name].count("wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8")

    base = count("bm128_bn128")
    assert base > 0 and count("bm256_bn128_splitk") == 2 * base and count("bm128_bn256") == 2 * base


def test_timing_ablations_compile_without_the_removed_parts(gluon_ptx):
    """ABLATE 3 keeps the wgmma but not the weight build (no PRMT-based asm); 7 drops the wgmma."""
    wgmma = "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"
    assert wgmma in gluon_ptx["ablate3"] and "prmt.b32 x" not in gluon_ptx["ablate3"]
    assert "prmt.b32 x" in gluon_ptx["one_consumer_blocks16"]
    assert wgmma not in gluon_ptx["ablate7"] and "cp.async.bulk.tensor" in gluon_ptx["ablate7"]


def test_load_ablations_issue_fewer_tma_loads(gluon_ptx):
    """ABLATE bits 8 / 16 / 32 (progressive_parts.py) leave the codes' / weights' / scales' TMA loads out of the
    ring's fill; with all three the kernel loads nothing."""
    def loads(name):
        return gluon_ptx[name].count("cp.async.bulk.tensor")

    assert 0 < loads("ablate15") < loads("one_consumer_blocks16") and loads("ablate63") == 0


def test_k_split_consumers_hand_their_sums_over_in_shared_memory(gluon_ptx):
    """kwarps = 2: each consumer runs the wgmmas of all BN rows (BN = 128: two m64 blocks per K tile, as the
    one-consumer tile), and consumer 1's int32 sums reach consumer 0 through shared memory behind an mbarrier."""
    def count(name):
        return gluon_ptx[name].count("wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8")

    p = gluon_ptx["ksplit_bm128_bn128"]
    assert count("bm128_bn128") > 0 and count("ksplit_bm128_bn128") == 2 * count("bm128_bn128")
    assert "st.shared.v" in p or "st.shared.b32" in p
    assert p.count("mbarrier.try_wait") > gluon_ptx["bm128_bn128"].count("mbarrier.try_wait")


@pytest.mark.parametrize("name", ["one_consumer_blocks16", "two_consumers_rows_splitk", "stream_k_bm256_bn128",
                                  "stream_k_one_consumer", "ksplit_bm128_bn128", "ksplit_bm128_bn64_splitk"])
def test_compiles_to_int8_wgmma_with_packed_weights(gluon_ptx, name):
    p = gluon_ptx[name]
    assert "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8" in p
    assert "cp.async.bulk.tensor" in p and "setmaxnreg" in p
    # the asm's $1 is a code word loaded as such, $9 is t (a float -> int conversion of scale / unit)
    # and $13 is (256 - tz) * 0x10001:
    # Triton hands each 32-bit argument of a pack-4 asm over as 4 operands, the first of which is read
    import re

    defs = {reg: op for op, reg in re.findall(r"^\s*(\S+)\s+(%r\d+),", p, re.M)}
    uses = re.findall(r"prmt\.b32 x, (%r\d+), 0, (%r\d+);.*?mad\.lo\.u32 a, a, (%r\d+), (%r\d+);", p)
    assert uses
    for w_reg, sel_reg, t_reg, c_reg in uses:
        assert defs[w_reg].startswith("ld.shared"), w_reg  # a code word straight from shared memory
        assert defs[t_reg] == "cvt.rzi.s32.f32", t_reg
        assert re.search(rf"mad\.lo\.s32\s+{c_reg}, %r\d+, 65537, 16777472;", p), c_reg
    # lane (g, t) always takes half t % 2 of its words: one selector register per consumer partition
    two = name in ("two_consumers_rows_splitk", "stream_k_bm256_bn128", "ksplit_bm128_bn128",
                   "ksplit_bm128_bn64_splitk")
    assert len({sel for _, sel, _, _ in uses}) == (2 if two else 1)
    # partial sums (split-K, stream-K) meet behind acq_rel counters; whole tiles need none
    assert ("atom.global.gpu.acq_rel.add" in p) == (name not in ("one_consumer_blocks16", "ksplit_bm128_bn128"))


@pytest.mark.parametrize("name", ["vec_bm256_bn128", "vec_bm128_bn256", "bm128_bn256"])
def test_row_stores_of_the_finished_tile(gluon_ptx, name):
    """store_rows: 16-byte stores of 8 weight rows, none of the wgmma layout's 2-byte stores."""
    import re

    stores = set(re.findall(r"st\.global(?:\.v\d)?\.b\d+", gluon_ptx[name]))
    vec = name.startswith("vec")
    assert ("st.global.v4.b32" in stores) == vec and ("st.global.b16" in stores) != vec, stores


@pytest.mark.parametrize("name", ["vec_bm256_bn128", "bm128_bn128", "stream_k_bm256_bn128"])
def test_whole_token_tiles_load_their_scales_in_pairs(gluon_ptx, name):
    """M is unspecialized, so a masked load of the token scales is one 4-byte load per token; tiles that
    end inside M take an unmasked branch whose loads are 8 bytes (a lane's two tokens), and only the
    last token tile the masked one (token_scaled)."""
    import re

    loads = re.findall(r"(@%p\d+ )?ld\.global(\.v2)?\.b32 ", gluon_ptx[name])
    assert any(not pred and v2 for pred, v2 in loads), "no unmasked 8-byte scale loads"
    assert any(pred and not v2 for pred, v2 in loads), "no masked scale loads for the last token tile"


@pytest.mark.parametrize("name", ["pdl_two_consumers_splitk", "pdl_stream_k", "two_consumers_rows_splitk"])
def test_pdl_loads_no_codes_before_the_wait(gluon_ptx, name):
    """With PDL the load warp lets the next kernel in, may request weights, scales and mins (nobody
    writes them) and waits for the previous kernel before any load of the codes (x_desc, the first
    parameter), which that kernel wrote; without PDL there is no griddepcontrol at all."""
    import re

    p = gluon_ptx[name]
    pdl = name.startswith("pdl")
    assert ("griddepcontrol.wait" in p and "griddepcontrol.launch_dependents" in p) == pdl
    if not pdl:
        return
    tma = r"cp\.async\.bulk\.tensor\.(\d)d\S*\s+\[%r\d+\], \[(%rd\d+),"
    head = re.findall(tma, p.split("griddepcontrol.wait", 1)[0])
    descs = {d for _, d in re.findall(tma, p)}
    if name == "pdl_stream_k":  # stream-K waits before its first load
        assert not head
    else:  # weights (3-d blocks16 boxes), scales and mins before the wait; the codes' descriptor only after
        assert {dim for dim, _ in head} == {"2", "3"}
        assert len(descs - {d for _, d in head}) == 1 and len(descs) == 4


@needs_hopper
def test_pdl_launch_gives_the_same_bits():
    """A chain of progressive launches, each reading the previous output's codes, with and without
    PDL (eager and replayed from a CUDA graph): identical outputs."""
    from gearshift.kernels import w4a8_progressive as P
    from gearshift.kernels.act_quant import quantize_act_triton

    torch.manual_seed(0)
    act = ActQuantSpec("int8")
    st = random_store("int4p", 1024, 1024, 128, "cuda", layout=BLOCKS16)
    x0 = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    cfgs = [c for c in progressive_configs(300) if progressive_supports(st, act, c)][:6]

    def chain(cfg):
        x = x0
        for _ in range(4):
            codes, scales = quantize_act_triton(x, act)
            x = P.progressive_codes(codes, scales, st, cfg, torch.bfloat16) * 0.05
        return x

    default = P.PROGRESSIVE_PDL
    for cfg in cfgs:
        outs = []
        for on in (False, True):
            P.PROGRESSIVE_PDL = on
            try:
                eager = chain(cfg)
                g = torch.cuda.CUDAGraph()
                chain(cfg)
                torch.cuda.synchronize()
                with torch.cuda.graph(g):
                    graphed = chain(cfg)
                g.replay()
                torch.cuda.synchronize()
                assert torch.equal(eager, graphed), (cfg, on)
                outs.append(eager)
            finally:
                P.PROGRESSIVE_PDL = default
        assert torch.equal(outs[0], outs[1]), cfg


def test_stream_k_model_slices_each_tile_where_its_programs_meet(monkeypatch):
    """The torch model of a stream-K launch (on a pretend 7-SM device) cuts each output tile's K
    where its programs' runs meet, and only there: it equals the unsliced model up to the fp32
    rounding of adding partials, and exactly where a tile is one run."""
    import gearshift.kernels.w4a16_wgmma as W16
    from gearshift.kernels.w4a8_progressive import w4a8_progressive_emulate

    monkeypatch.setattr(W16, "sm_count", lambda device: 7)
    torch.manual_seed(0)
    st = random_store("int4p", 256, 2048, 128, "cpu")
    codes = torch.randint(-127, 128, (100, 2048), dtype=torch.int8)
    scales = torch.rand(100) * 0.01
    whole = w4a8_progressive_emulate(codes, scales, st, torch.float32)
    cfg = TileConfig(64, 64, 128, 1, 4, 4, stream_k=1)  # 2 x 4 tiles of 16 K tiles on 7 programs: per = 19
    sk = w4a8_progressive_emulate(codes, scales, st, torch.float32, cfg=cfg)
    assert _rel(sk, whole) < 1e-6 and not torch.equal(sk, whole)
    assert W16.stream_k_runs(0, 16, 19) == [(0, 16)] and W16.stream_k_runs(1, 16, 19) == [(0, 3), (3, 16)]
    assert torch.equal(sk[:64, :64], whole[:64, :64])  # tile 0 (tokens 0..63, rows 0..63) is one run
    # hybrid: 8 tiles on 7 programs: tiles 0..6 whole (exact), tile 7 (tokens 64.., rows 192..) in runs of 3
    hy = w4a8_progressive_emulate(codes, scales, st, torch.float32, cfg=replace(cfg, hybrid=True))
    assert W16.stream_k_runs(7, 16, 3, 7 * 16) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 16)]
    assert torch.equal(hy[:, :192], whole[:, :192]) and torch.equal(hy[:64], whole[:64])
    assert _rel(hy, whole) < 1e-6 and not torch.equal(hy, whole)


@needs_hopper
@pytest.mark.parametrize("layout", [ROWS, BLOCKS16])
@pytest.mark.parametrize("act_dtype", ["int8", "int4"])
def test_kernel_matches_its_model_bit_for_bit(layout, act_dtype):
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.w4a8_progressive import progressive_codes, w4a8_progressive

    torch.manual_seed(0)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4p", 384, 2048, 128, "cuda", layout=layout)
    real = quantize_int4_progressive(torch.randn(256, 1024, device="cuda"), 128).to_layout(layout)
    bound = 3e-2 if act_dtype == "int4" else 5e-3  # the quantizers' rounding (docs/kernels.md bounds)
    for store in (st, real):
        for m in (1, 64, 100, 300):
            x = torch.randn(m, store.in_features, device="cuda", dtype=torch.bfloat16)
            codes, scales = quantize_act_triton(x, act)
            ref = linear_reference(x.float(), store, act).cpu()
            for cfg in progressive_configs(max(m, 64)):
                if not progressive_supports(store, act, cfg):
                    continue
                emu = w4a8_progressive_emulate(codes, scales, store, torch.float32, cfg.split_k, cfg).cpu()
                y = progressive_codes(codes, scales, store, cfg, torch.float32).cpu()
                assert torch.equal(y, emu), (m, cfg, _rel(y, emu))
                y2 = w4a8_progressive(x, store, act, cfg).float().cpu()
                assert _rel(y2, ref) < bound, (m, cfg)


def test_codes_are_padded_to_whole_token_tiles_where_many_rows_are_absent(monkeypatch):
    """`code_rows`: zero rows up to a whole token tile where `PAD_ABSENT_ROWS` (96) or more of its rows would lie
    past the codes (stop 72); fewer, or PAD_ABSENT_ROWS -1, and the codes go as they are."""
    from gearshift.kernels import w4a8_progressive as P

    for m, bm, rows in ((129, 256, 256), (129, 128, 256), (160, 256, 256), (160, 128, 256), (300, 256, 512),
                        (65, 128, 65), (200, 256, 200), (200, 128, 200), (700, 256, 700), (256, 256, 256)):
        codes = torch.randint(-127, 128, (m, 64), dtype=torch.int8)  # (a storage that ends at the codes)
        p = P.code_rows(codes, bm)
        assert p.shape == (rows, 64), (m, bm)
        assert torch.equal(p[:m], codes) and not p[m:].any()
    codes = torch.randint(-127, 128, (200, 64), dtype=torch.int8)
    monkeypatch.setattr(P, "PAD_ABSENT_ROWS", -1)
    assert P.code_rows(codes[:129], 256).shape[0] == 129  # never copied
    assert P.code_rows(codes[:129], 100).shape[0] == 200  # (room in the storage: always taken)
    monkeypatch.setattr(P, "PAD_ABSENT_ROWS", 0)
    assert P.code_rows(torch.zeros(200, 64, dtype=torch.int8), 256).shape[0] == 256


@pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")
def test_the_codes_descriptor_is_built_on_code_rows(monkeypatch):
    """The kernel's TMA descriptor reads `code_rows`' rows, and the kernel is still told the codes' own M."""
    from gearshift.kernels import w4a8_progressive as P

    class Built(Exception):
        pass

    seen = []

    def descriptor(codes, bm, bk):
        seen.append(codes.shape[0])
        raise Built

    monkeypatch.setattr(P, "_code_descriptor", descriptor)
    st = random_store("int4p", 256, 1024, 128, "cpu")
    for m, rows in ((129, 256), (100, 100)):
        with pytest.raises(Built):
            P.progressive_codes(torch.zeros(m, 1024, dtype=torch.int8), torch.ones(m), st,
                                TileConfig(128, 64, 128, 1, 4, 4), torch.bfloat16)
        assert seen[-1] == rows, m


@needs_hopper
@pytest.mark.parametrize("m", [65, 129, 200, 300])
def test_padded_codes_give_the_same_bits(m, monkeypatch):
    """Codes padded to whole token tiles, read from other codes past them in their own storage, or read with the
    rows past M out of bounds: the same output."""
    from gearshift.kernels import switches
    from gearshift.kernels import w4a8_progressive as P
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.w4a8_progressive import progressive_codes

    torch.manual_seed(0)
    act = ActQuantSpec("int8")
    st = random_store("int4p", 384, 2048, 128, "cuda", layout=BLOCKS16)
    codes, scales = quantize_act_triton(torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16), act)
    room = torch.randint(-127, 128, (512, 2048), device="cuda", dtype=torch.int8)
    room[:m] = codes
    for cfg in progressive_configs(m):
        if not progressive_supports(st, act, cfg):
            continue
        monkeypatch.setattr(P, "PAD_ABSENT_ROWS", 0)  # every partial tile padded
        y = progressive_codes(codes, scales, st, cfg, torch.bfloat16)
        assert torch.equal(y, progressive_codes(room[:m], scales, st, cfg, torch.bfloat16)), (m, cfg)
        monkeypatch.setattr(P, "PAD_ABSENT_ROWS", -1)
        monkeypatch.setitem(switches._FUSED, "tile_room", False)
        assert torch.equal(y, progressive_codes(codes, scales, st, cfg, torch.bfloat16)), (m, cfg)
        monkeypatch.setitem(switches._FUSED, "tile_room", True)


def test_hybrid_needs_a_stream_k_launch():
    act = ActQuantSpec("int8")
    st = random_store("int4p", 4096, 4096, 128, "cpu", layout=BLOCKS16)
    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    assert progressive_supports(st, act, TileConfig(256, 128, 128, 1, 8, 3, stream_k=1, hybrid=True))
    assert not progressive_supports(st, act, TileConfig(256, 128, 128, 1, 8, 3, hybrid=True))


def test_fp32_outputs_store_rows_only_where_the_scratch_fits():
    from gearshift.kernels.w4a8_progressive import PROGRESSIVE_VEC_STORE, vec_store

    wide = TileConfig(128, 256, 128, 1, 8, 5)  # 205824 bytes of ring: + 32 KB of fp32 scratch is over
    assert not vec_store(wide, torch.float32)
    assert vec_store(wide, torch.bfloat16) == PROGRESSIVE_VEC_STORE
    assert vec_store(TileConfig(256, 128, 128, 1, 8, 3), torch.float32) == PROGRESSIVE_VEC_STORE


@needs_hopper
def test_hybrid_stream_k_matches_its_model_bit_for_bit():
    """200 tiles on 132 SMs: one wave of whole tiles, then 68 tiles split over every program."""
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.w4a8_progressive import progressive_codes

    torch.manual_seed(0)
    act = ActQuantSpec("int8")
    st = random_store("int4p", 12800, 1024, 128, "cuda", layout=BLOCKS16)
    codes, scales = quantize_act_triton(torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16), act)
    cfgs = [c for c in progressive_configs(300) if c.hybrid and progressive_supports(st, act, c)]
    assert cfgs
    for cfg in cfgs:
        y = progressive_codes(codes, scales, st, cfg, torch.float32)
        assert torch.equal(y, w4a8_progressive_emulate(codes, scales, st, torch.float32, cfg=cfg)), cfg


def _run_ptx(asm: str, operands: dict) -> int:
    """A few PTX integer instructions (the ones the weight asm uses), on 32-bit registers."""
    import re

    regs = dict(operands)
    body = asm.strip()[1:-1]
    for ins in filter(None, (i.strip() for i in body.split(";"))):
        if ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        args = [x.strip() for x in args.split(",")]

        def val(x):
            return int(x, 16) if x.startswith("0x") else int(x) if x.isdigit() else regs[x]

        if op == "and.b32":
            r = val(args[1]) & val(args[2])
        elif op == "shr.u32":
            r = val(args[1]) >> val(args[2])
        elif op == "mad.lo.u32":
            r = val(args[1]) * val(args[2]) + val(args[3])
        elif op == "prmt.b32":
            src = val(args[1]) | (val(args[2]) << 32)
            sel = val(args[3])
            r = 0
            for i in range(4):
                n = (sel >> (4 * i)) & 0xF
                byte = (src >> (8 * (n & 7))) & 0xFF
                if n & 8:
                    byte = 0xFF if byte & 0x80 else 0
                r |= byte << (8 * i)
        else:
            raise AssertionError(f"unexpected instruction {op}")
        regs[args[0]] = r & 0xFFFFFFFF
        assert re.fullmatch(r"\$?\w+", args[0])
    return regs["$0"]


@pytest.mark.skipif(not HAS_GLUON, reason="this Triton has no Gluon")
def test_weight_asm_gives_t_q_minus_tz_for_every_code_pair():
    """The shipped inline PTX, run instruction by instruction: for random and extreme code words,
    both halves of the word and every (t, tz) the checks allow, the four output bytes are the
    int8 weights t * q - tz of the half's four codes, low nibble first."""
    import numpy as np

    from gearshift.kernels import w4a8_progressive as P

    asm = P._INT8_WEIGHTS.value
    rng = np.random.default_rng(0)
    words = [int(w) for w in rng.integers(0, 1 << 32, size=48, dtype=np.uint64)] + [0, 0xFFFFFFFF, 0x0F0F0F0F]
    for t in range(0, 16):
        for tz in sorted({0, 127, max(0, 15 * t - 127), min(127, 8 * t), 7 * t, max(0, 15 * t - 127) + 1}):
            if tz > 127 or 15 * t - tz > 127:
                continue
            c = ((256 - tz) * 65537) & 0xFFFFFFFF
            for word in words:
                for half, sel in ((0, P._LOW_HALF.value), (1, P._HIGH_HALF.value)):
                    out = _run_ptx(asm, {"$1": word, "$5": sel, "$9": t, "$13": c})
                    got = [((out >> (8 * i)) & 0xFF) for i in range(4)]
                    got = [v - 256 if v > 127 else v for v in got]
                    codes = [(word >> (16 * half + 4 * i)) & 15 for i in range(4)]
                    assert got == [t * q - tz for q in codes], (t, tz, hex(word), half)


@needs_hopper
@pytest.mark.parametrize("act_dtype", ["int8", "int4"])
def test_dispatcher_takes_codes_from_the_norm(act_dtype):
    """Where the map picks w4a8_progressive, the dispatcher asks for the norm's codes and, given
    them, returns the same bits as quantizing itself; codes for another range are ignored."""
    from gearshift.dispatch.dispatcher import AdaptiveDispatcher
    from gearshift.dispatch.policy import Choice, PolicyMap, type_key
    from gearshift.kernels.rmsnorm import rms_norm_codes_triton

    torch.manual_seed(1)
    act = ActQuantSpec(act_dtype)
    st = random_store("int4p", 512, 1024, 128, "cuda", layout=BLOCKS16)
    cfg = next(c for c in progressive_configs(128) if progressive_supports(st, act, c))
    pm = PolicyMap("test", [128], {type_key(f"w4a{act.bits}", 128, 512, 1024): [Choice("w4a8_progressive", cfg)]})
    disp = AdaptiveDispatcher(pm)
    qmax = 127.0 if act_dtype == "int8" else 7.0
    assert disp.codes_qmax(st, act, 128) == qmax
    assert disp.codes_qmax(st, None, 128) is None  # W4A16 quantizes nothing
    x = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16)
    h, codes = rms_norm_codes_triton(x, torch.ones(1024, device="cuda", dtype=torch.bfloat16), 1e-5, qmax)
    plain = disp.linear(h, st, act)
    assert torch.equal(disp.linear(h, st, act, codes=codes), plain)
    wrong = rms_norm_codes_triton(x, torch.ones(1024, device="cuda", dtype=torch.bfloat16), 1e-5,
                                  7.0 if qmax == 127.0 else 127.0)[1]
    assert torch.equal(disp.linear(h, st, act, codes=wrong), plain)
