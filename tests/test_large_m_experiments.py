"""Stop 40's large-M W4A16 experiments (`benchmarks/tc_ablations/`): the `tl.dot` ceiling kernels of
`bf16_gemm_ceiling.py` against torch (TRITON_INTERPRET=1 on CPU, or a GPU), and the dequant-producer
Gluon kernel of `wgmma_dq_producer.py` compiled for sm_90 with what it claims in its PTX: both wgmma
operands in shared memory, one wgmma left in flight, a warpgroup of its own for the dequantization."""
import re

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from bench_scripts import load_script, test_device as _device  # noqa: E402  (tests/bench_scripts.py)
from gearshift.dispatch.profiler import random_store  # noqa: E402


def _load(name: str):
    return load_script(f"tc_ablations/{name}.py")


CEIL = _load("bf16_gemm_ceiling")  # a module global: the jit wrapper below calls into it


@pytest.fixture(autouse=True)
def _allocator():
    dev = _device()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))


def test_dequantized_tile_matches_the_store():
    """`_dequant_tile` (the W4A16 ceiling kernel's B operand) gives the store's own dequantization:
    (128 + q) * s + (min - 128 s) in fp32, rounded once, is q * s + min rounded once (on a GPU; the
    interpreter truncates the final bf16 conversion)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def tile_out(w_desc, s_ptr, mn_ptr, out_ptr, K, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr):
        n0 = tl.program_id(0) * BN
        k = tl.program_id(1) * BK
        w = CEIL._dequant_tile(w_desc, s_ptr, mn_ptr, n0, k, K, BN, BK, G)
        rows = n0 + tl.arange(0, BN)
        cols = k + tl.arange(0, BK)
        tl.store(out_ptr + rows[:, None] * K + cols[None, :], w)

    dev = _device()
    n, k = 64, 256
    st = random_store("int4", n, k, 128, dev, layout="rows")
    out = torch.empty(n, k, dtype=torch.bfloat16, device=dev)
    tile_out[(n // 32, k // 64)](TensorDescriptor.from_tensor(st.qweight, [32, 32]), st.scales, st.mins, out, k,
                                 BN=32, BK=64, G=128)
    want = st.dequantize(torch.float32).to(torch.bfloat16)
    if dev == "cuda":
        assert torch.equal(out, want)
    else:  # the interpreter truncates to bf16 where the GPU rounds: one bf16 step at most
        assert torch.allclose(out.float(), want.float(), rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("swap,persistent", [(False, False), (True, False), (False, True)])
def test_dense_ceiling_gemm_matches_torch(swap, persistent):
    """The dense `tl.dot` GEMMs, fp16 operands (this Triton's interpreter gets bf16 dots wrong),
    ragged M, against the fp32 product to within the bf16 output rounding."""
    if persistent and not torch.cuda.is_available():
        pytest.skip("the persistent launch sizes its grid from the GPU's SM count")
    dev = _device()
    x = torch.randn(100, 256, device=dev).half()
    w = (torch.randn(192, 256, device=dev) * 0.05).half()
    f, y = CEIL.gemm(x, w, (64, 64, 64, 2, 4), swap=swap, persistent=persistent)
    f()
    ref = x.float() @ w.float().t()
    assert ((y.float() - ref).norm() / ref.norm()).item() < 8e-3


PRODUCER = r'''
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "tc_ablations"))
import torch
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
import wgmma_dq_producer as D
from gearshift.dispatch.profiler import random_store
from gearshift.kernels import w4a16_wgmma as W

st = random_store("int4p", 4096, 4096, 128, "cpu", layout="blocks16")
xd, wd = W._descriptors(torch.empty(256, 4096, dtype=torch.bfloat16), st, 256, 128, 64)
sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "s_ptr": "*fp16", "mn_ptr": "*fp16", "y_ptr": "*bf16",
       "M": "i32", "N": "i32", "K": "i32"}
for name, pair in (("single", False), ("pair", True)):
    cx = {"G": 128, "BN": 128, "STAGES": 4, "AST": 4 if pair else 2, "BLOCKS": True, "F16": False, "C_REGS": 200,
          "num_warps": 4, "ABL": 0, "LAG": 0, "PACKED": True, "VEC": True, "PAIR": pair, "WORDS": 0}
    s = dict(sig, **{n: "constexpr" for n in cx})
    names = list(s)
    src = GluonASTSource(fn=D.dq_kernel, signature=s, constexprs={(names.index(k),): v for k, v in cx.items()},
                         attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ("s_ptr", "mn_ptr", "y_ptr", "N", "K")})
    out[name] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 168}).asm["ptx"]
cx = {"G": 128, "BN": 128, "XST": 3, "BST": 8, "AST": 4, "BLOCKS": True, "F16": False, "C_REGS": 200,
      "INTERLEAVED": False, "num_warps": 4, "PAIRSLOTS": 1}
s = dict(sig, **{n: "constexpr" for n in cx})
names = list(s)
src = GluonASTSource(fn=D.dq_split_kernel, signature=s, constexprs={(names.index(k),): v for k, v in cx.items()},
                     attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ("s_ptr", "mn_ptr", "y_ptr", "N", "K")})
out["split"] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 168}).asm["ptx"]
'''


def test_dequant_producer_kernel_is_a_shared_memory_pipeline(compile_sm90):
    out = compile_sm90(PRODUCER)
    for name, ptx in out.items():
        mmas = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
        # 2 consumers x (the peeled first tile + the loop) x 4 k16 steps, each m64n256
        assert len(mmas) == 16 and all("m64n256k16" in ln for ln in mmas), name
        # shared-memory A: a 64-bit descriptor operand, not a list of A registers before the B descriptor
        assert all(re.search(r"\}, %rd\d+, %rd\d+", ln) for ln in mmas), name
        assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx), name  # one left in flight
        assert "fence.proxy.async.shared::cta" in ptx, name  # the producer's stores made visible to wgmma
        regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx)
        assert ("inc", "200") in regs, name  # the consumers' accumulators
    # the split-ring form: its producer's word dequantization (packed subtract and FMA, PRMTs into memory
    # order) and byte loads as 16-byte int32 words
    split = out["split"]
    assert split.count("fma.rn.bf16x2") >= 8 and "prmt.b32" in split
    assert re.search(r"ld\.shared\.v4\.b32", split)
