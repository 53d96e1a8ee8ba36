"""The Triton kernels of `benchmarks/tc_ablations/int8_gemm_ceiling.py` against torch, small shapes
(TRITON_INTERPRET=1 on CPU, or a GPU): the int4-prog -> int8 widening pass exactly, the two GEMMs
to within one bf16 rounding of the fp32 result (the interpreter truncates to bf16, a GPU rounds)."""

import pytest
import torch

triton = pytest.importorskip("triton")

from bench_scripts import load_script, test_device as _device  # noqa: E402  (tests/bench_scripts.py)
from gearshift.dispatch.profiler import random_store  # noqa: E402


@pytest.fixture(scope="module")
def ceiling():
    return load_script("tc_ablations/int8_gemm_ceiling.py")


def _allocator(dev):
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))


def test_widening_pass_matches_int8_weights(ceiling):
    dev = _device()
    n, k = 128, 256
    st = random_store("int4p", n, k, 128, dev, layout="rows")
    w8 = torch.empty(n, k, dtype=torch.int8, device=dev)
    ceiling._dequant8[(n // 64, k // 128)](st.qweight, st.scales, st.mins, st.row_units, w8, k, G=128, BN=64)
    assert torch.equal(w8, st.int8_weights())


def _within_one_bf16_step(y: torch.Tensor, ref32: torch.Tensor) -> bool:
    step = torch.finfo(torch.bfloat16).eps * ref32.abs().clamp_min(1e-30)  # one bf16 step at |ref|, at most
    return bool(((y.float() - ref32).abs() <= step).all())


@pytest.mark.parametrize("which", ["int8", "int4"])
def test_gemm_matches_torch(ceiling, which):
    dev = _device()
    _allocator(dev)
    m, n, k = 100, 128, 256  # a ragged token count; two groups of 128
    st = random_store("int4p", n, k, 128, dev, layout="rows")
    codes = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=dev)
    xs = torch.rand(m, device=dev) + 0.5
    unit = st.row_units.float().contiguous()
    w8 = st.int8_weights()
    tile = (64, 64, 128, 2, 4, 2)
    f, y = (ceiling.int8_gemm(codes, w8, unit, xs, tile) if which == "int8"
            else ceiling.int4_gemm(codes, st, unit, xs, tile))
    f()
    ref32 = (codes.double() @ w8.double().t()).float() * unit[None, :] * xs[:, None]
    assert _within_one_bf16_step(y, ref32)
    assert not _within_one_bf16_step(y, ref32 * 1.01)  # the tolerance is tight enough to catch a 1% error
