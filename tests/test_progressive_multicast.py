"""The TMA-multicast experiment (`benchmarks/tc_ablations/progressive_multicast.py`, stop 38) compiles
for sm_90 under Triton >= 3.9, with the cluster protocol it relies on visible in the PTX: the codes
loaded once by cluster rank 0 for both CTAs, CTA 1's slot releases reaching CTA 0's barrier, and
every CTA storing its own rows (a store of a cluster-replicated tensor would be left to CTA 0)."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9):
    pytest.skip("Gluon clusters need Triton >= 3.9", allow_module_level=True)

BODY = r'''
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "tc_ablations"))
os.environ["GEARSHIFT_MC_ARRIVE"] = "relaxed"
import torch
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
import progressive_multicast as PM
from gearshift.dispatch.profiler import random_store

st = random_store("int4p", 4096, 4096, 128, "cpu", layout="blocks16")
for mc in (1, 2):
    xd, wd, sd, md = PM.descriptors(torch.empty(256, 4096, dtype=torch.int8), st, 256, 128, mc)
    sig = {"x_desc": mangle_type(xd), "w_desc": mangle_type(wd), "sc_desc": mangle_type(sd),
           "mn_desc": mangle_type(md), "units_ptr": "*fp32", "xs_ptr": "*fp32", "y_ptr": "*bf16", "M": "i32",
           "N": "i32", "K": "i32"}
    cx = {"STAGES": 3, "MC": mc, "MULTICAST": mc > 1, "COUPLED": mc > 1, "CONSUMERS": 2}
    sig.update({n: "constexpr" for n in cx})
    names = list(sig)
    src = GluonASTSource(fn=PM.mc_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in cx.items()},
                         attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ("y_ptr", "N", "K")})
    out[f"mc{mc}"] = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": 4, "num_ctas": mc}).asm["ptx"]
'''


def _code(ptx: str) -> list[str]:
    return [ln.strip() for ln in ptx.splitlines() if not ln.strip().startswith((".loc", ".file", "//"))]


def test_the_cluster_variant_multicasts_the_codes_and_releases_slots_across_ctas(compile_sm90):
    out = compile_sm90(BODY)
    plain, mc = _code(out["mc1"]), _code(out["mc2"])
    assert not any("multicast::cluster" in ln or "cluster_ctarank" in ln for ln in plain)
    assert ".reqnctapercluster 2" in mc
    loads = [ln for ln in mc if "cp.async.bulk.tensor" in ln]
    assert sum(".multicast::cluster" in ln for ln in loads) == 1  # the codes, once per slot
    assert sum("shared::cta.global" in ln for ln in loads) == 3  # weights, scales, mins: each CTA its own
    assert any(re.search(r"mapa\.shared::cluster.*mbarrier\.arrive\.relaxed\.cluster\.shared::cluster", ln)
               for ln in mc)
    # the stores: one per element and thread in inline PTX, none left to cluster rank 0 alone
    assert sum("st.global.b16" in ln for ln in mc) >= 64
    # 2 consumers x 2 token halves x 4 k32 steps of a 128-wide group
    assert sum("wgmma.mma_async" in ln and ".s32.s8.s8" in ln for ln in mc) == 16
