"""int8 activation codes in the fragment kernel's column order (`x_tiles.S8_FRAGMENT_ORDER`, stop 69): the
dispatcher asks the producers for them where the kernel reads them (`CodesSpec.fragment_order`), takes codes only
in the order its kernel reads, and the model's W4A8 decode steps give the same logits with the switch on and off.
The block itself: tests/test_fragment_asm.py; the producers: the RMSNorm, SwiGLU, decode attention and quantizer
tests."""

import dataclasses

import pytest
import torch

from gearshift.dispatch import strategies
from gearshift.dispatch.dispatcher import _takes
from gearshift.kernels import switches
from gearshift.kernels.act_quant import ActCodes, CodesSpec, natural_codes
from gearshift.kernels.x_tiles import S8_FRAGMENT_ORDER, from_fragment_order, to_fragment_order
from gearshift.quant.activations import ActQuantSpec


def test_only_the_int8_fragment_kernel_reads_fragment_order_codes():
    readers = {s.name for s in strategies.STRATEGIES.values() if s.codes_fragment_order}
    assert readers == {"w4a8_mma_int8"} and ("s8_fragment_order", True) in switches.state()
    assert CodesSpec(127.0, torch.int8).fragment_order is False and ActCodes(None, None, 7.0).fragment_order is False
    assert sorted(S8_FRAGMENT_ORDER) == list(range(8))


def test_a_kernel_takes_codes_only_in_the_order_it_reads():
    """`_takes`: fragment-order codes for the int8 fragment kernel while the switch is on, row-order codes for
    every other kernel (and for it with the switch off); `natural_codes` undoes the order."""
    act = ActQuantSpec("int8")
    q = torch.randint(-127, 128, (3, 256), dtype=torch.int8)
    s = torch.ones(3)
    frag, rows = ActCodes(to_fragment_order(q), s, 127.0, True), ActCodes(q, s, 127.0)
    assert torch.equal(natural_codes(frag), q) and natural_codes(rows) is q
    assert torch.equal(from_fragment_order(frag.codes), q)
    mma8, prog = strategies.STRATEGIES["w4a8_mma_int8"], strategies.STRATEGIES["w4a8_progressive"]
    before = switches.state()
    try:
        assert _takes(mma8, frag, act, q.shape, torch.bfloat16) and not _takes(mma8, rows, act, q.shape, torch.bfloat16)
        assert _takes(prog, rows, act, q.shape, torch.bfloat16) and not _takes(prog, frag, act, q.shape, torch.bfloat16)
        switches.set_switches(s8_fragment_order=False)
        assert _takes(mma8, rows, act, q.shape, torch.bfloat16) and not _takes(mma8, frag, act, q.shape, torch.bfloat16)
    finally:
        switches.set_switches(**dict(before))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_w4a8_decode_steps_are_bit_identical_in_either_order(monkeypatch):
    """W4A8 steps of 1, 4 and 16 sequences (and of 2 with decode attention emitting o's codes) with the codes in
    fragment order and in rows; the int8 fragment kernel gets fragment-order codes from the producers."""
    from gearshift.model.tiny import build_random_model

    seen = []
    real = strategies.STRATEGIES["w4a8_mma_int8"]

    def spy_codes(codes, store, cfg, out_dtype):
        seen.append(codes.fragment_order)
        return real.run_codes(codes, store, cfg, out_dtype)

    monkeypatch.setitem(strategies.STRATEGIES, "w4a8_mma_int8", dataclasses.replace(real, run_codes=spy_codes))
    model = build_random_model("llama3-8b", weights="int4", num_hidden_layers=2, device="cuda")
    before = switches.state()
    try:
        for b, extra in ((4, {}), (16, {}), (1, {}), (2, {"decode_attention_codes": True})):
            out = {}
            ids = torch.randint(0, 1000, (b, 2), device="cuda")
            for on in (False, True):
                switches.set_switches(s8_fragment_order=on, **extra)
                cache = model.new_cache(b, 64)
                first = model(ids[:, :1], cache, [0] * b, [1] * b, mode="w4a8", logits="last")
                out[on] = (first, model(ids[:, 1:], cache, [1] * b, [1] * b, mode="w4a8", logits="last"))
            assert all(torch.equal(a, b_) for a, b_ in zip(out[True], out[False])), b
    finally:
        switches.set_switches(**dict(before))
    assert True in seen and False in seen  # both orders reached the kernel
