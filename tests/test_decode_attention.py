"""`kernels/decode_attention.py` against its torch reference (CPU under the Triton interpreter, or
a GPU): outputs, the o projection's codes bit for bit against the quantizer, results that do not
depend on the bucket, the batch or the other tokens of the pass, and the model wiring."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON

GPU = torch.cuda.is_available()
if not HAS_TRITON or not GPU and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("needs a GPU or the Triton interpreter", allow_module_level=True)

from gearshift.kernels.act_quant import quantize_act_triton  # noqa: E402
from gearshift.kernels.decode_attention import (decode_attention_reference,  # noqa: E402
                                                decode_attention_triton)
from gearshift.kernels.splitk import zeroed_words  # noqa: E402
from gearshift.kernels.x_tiles import to_fragment_order  # noqa: E402
from gearshift.quant.activations import ActQuantSpec  # noqa: E402

DEV = "cuda" if GPU else "cpu"
# small chunks so that a few dozen keys already split over programs, and beyond 64 keys into longer chunks
SMALL = {"chunk": 32, "block": 16, "max_splits": 2}


def _inputs(b, t, h, kv, d, cap, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, d, generator=g).to(DEV, dtype)
    k = torch.randn(b, kv, cap + 1, d, generator=g).to(DEV, dtype)
    v = torch.randn(b, kv, cap + 1, d, generator=g).to(DEV, dtype)
    return q, k, v


@pytest.mark.parametrize("h,kv,d", [(8, 2, 32), (4, 4, 16), (8, 1, 64)], ids=["gqa4", "mha", "mqa"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_matches_the_reference(h, kv, d, dtype):
    cap = 100
    q, k, v = _inputs(2, 3, h, kv, d, cap, dtype)
    slots = torch.tensor([[4, 5, 6], [60, 80, cap]], device=DEV)  # the last is padding: the scratch slot
    for upto in (7, 62, 96):
        want = decode_attention_reference(q, k, v, slots, upto)
        got, codes = decode_attention_triton(q, k, v, slots, upto, **SMALL)
        assert codes is None and got.shape == (2, 3, h * d) and got.dtype == dtype
        live = slots.view(-1) < upto  # rows whose every visible key is below upto
        torch.testing.assert_close(got.view(6, -1)[live].float(), want.view(6, -1)[live].float(),
                                   atol=2e-2, rtol=2e-2)


# float codes: bf16 on a GPU; fp16 under the interpreter, whose int8 -> bf16 conversion is garbage
@pytest.mark.skipif(not GPU, reason="thousands of keys: too slow for the interpreter")
def test_long_contexts_with_the_engines_chunks():
    cap = 6000
    q, k, v = _inputs(2, 2, 8, 2, 128, cap, seed=3)
    slots = torch.tensor([[700, 701], [5000, 5001]], device=DEV)
    got, codes = decode_attention_triton(q, k, v, slots, 5002, qmax=127.0)
    want = decode_attention_reference(q, k, v, slots, 5002)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    want_q, want_s = quantize_act_triton(got.view(4, -1), ActQuantSpec("int8"))
    assert torch.equal(codes.codes, want_q) and torch.equal(codes.scales, want_s)
    assert torch.equal(got[1, 1], decode_attention_triton(q[1:, 1:], k[1:], v[1:], slots[1:, 1:], 6000)[0][0, 0])


@pytest.mark.parametrize("qmax,codes_dtype", [(127.0, torch.int8), (7.0, torch.int8),
                                              (127.0, torch.bfloat16 if GPU else torch.float16)],
                         ids=["int8", "int4", "float-codes"])
def test_codes_are_the_quantizers_bits(qmax, codes_dtype):
    q, k, v = _inputs(3, 2, 8, 2, 32, 80, seed=1)
    slots = torch.tensor([[10, 11], [40, 41], [70, 71]], device=DEV)
    out, codes = decode_attention_triton(q, k, v, slots, 72, qmax=qmax, codes_dtype=codes_dtype, **SMALL)
    plain, _ = decode_attention_triton(q, k, v, slots, 72, **SMALL)
    assert torch.equal(out, plain)  # emitting codes does not change the output
    spec = ActQuantSpec("int8" if qmax == 127.0 else "int4")
    want_q, want_s = quantize_act_triton(out.view(6, -1), spec, codes_dtype=codes_dtype)
    assert codes.codes.dtype == codes_dtype and codes.qmax == qmax
    assert torch.equal(codes.codes, want_q) and torch.equal(codes.scales, want_s)
    assert not zeroed_words("decode_attention", out.device, 1).any()  # arrival counters back at zero
    if codes_dtype == torch.int8:  # in the int8 fragment block's column order: the same codes, each 8 permuted
        _, fo = decode_attention_triton(q, k, v, slots, 72, qmax=qmax, fragment_order=True, **SMALL)
        assert fo.fragment_order and torch.equal(fo.codes, to_fragment_order(want_q))
        assert torch.equal(fo.scales, want_s)


def test_a_tokens_bits_do_not_depend_on_the_bucket_batch_or_pass():
    """What QSPEC's exactness needs: the verify pass (several tokens) and plain decoding (one token
    at a time, other batch rows beside it, another attention bucket) give the same bits."""
    cap = 160
    q, k, v = _inputs(2, 4, 8, 2, 32, cap, seed=2)
    slots = torch.tensor([[20, 21, 22, 23], [90, 91, 92, 93]], device=DEV)
    whole, _ = decode_attention_triton(q, k, v, slots, 94, **SMALL)
    assert torch.equal(whole, decode_attention_triton(q, k, v, slots, 128, **SMALL)[0])
    for t in range(4):
        one, _ = decode_attention_triton(q[1:, t:t + 1], k[1:], v[1:], slots[1:, t:t + 1], slots[1, t].item() + 1,
                                         **SMALL)
        assert torch.equal(one[0, 0], whole[1, t])


def test_rejects_what_it_cannot_run():
    q, k, v = _inputs(1, 1, 6, 4, 32, 8)
    with pytest.raises(ValueError, match="H % KV"):
        decode_attention_triton(q, k, v, torch.zeros(1, 1, dtype=torch.long, device=DEV), 1)
    q, k, v = _inputs(1, 1, 4, 2, 32, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match="bf16 / fp16"):
        decode_attention_triton(q, k, v, torch.zeros(1, 1, dtype=torch.long, device=DEV), 1)


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen3"])  # Qwen3: q / k norms before RoPE, q from split_qkv
def test_the_model_runs_it_and_feeds_o_its_codes(monkeypatch, preset):
    """A bf16 model's short passes on the fused path attend with this kernel; under W4A8 o_proj gets
    the codes (checked against the quantizer) and the logits stay those of the torch path."""
    from gearshift.dispatch import Dispatcher, get_dispatcher, set_dispatcher
    from gearshift.kernels.act_quant import CodesSpec, codes_qmax
    from gearshift.kernels.reference import linear_reference
    from gearshift.kernels import decode_attention as da
    from gearshift.kernels.switches import fused_on_cpu, set_decode_attention
    from gearshift.model.tiny import build_random_model

    class CodesDispatcher(Dispatcher):
        """Takes int8 codes for every per-token integer mode, checks them against the quantizer."""

        def __init__(self):
            self.seen = []

        def codes_qmax(self, store, act, m):
            return codes_qmax(act)

        def codes_for(self, store, act, m, dtype):
            qmax = codes_qmax(act)
            return None if qmax is None else CodesSpec(qmax, torch.int8)

        def linear(self, x, store, act, bias=None, codes=None):
            self.seen.append((store.out_features, store.in_features, codes is not None))
            if codes is not None:
                want_q, want_s = quantize_act_triton(x.reshape(-1, x.shape[-1]), act)
                assert torch.equal(codes.codes, want_q) and torch.equal(codes.scales, want_s)
            return linear_reference(x, store, act, bias)

    calls = []
    real = da.decode_attention_triton
    monkeypatch.setattr("gearshift.model.transformer.decode_attention_triton",
                        lambda *a, **kw: calls.append(a[3].shape) or real(*a, **kw))
    torch.manual_seed(0)
    model = build_random_model(preset, weights="int4", device=DEV, dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (3, 5), device=DEV)  # three sequences
    old = get_dispatcher()
    set_dispatcher(d := CodesDispatcher())
    try:
        outs = {}
        for fused in (False, True):
            fused_on_cpu(fused)
            set_decode_attention(fused, codes=True)
            cache = model.new_cache(3, 16)
            model(ids, cache, [0] * 3, [5] * 3, mode="w4a8")
            d.seen.clear()
            outs[fused] = model(ids[:, -1:], cache, [5] * 3, [1] * 3, mode="w4a8")
        o = (model.config.hidden_size, model.config.hidden_size)
        assert (*o, True) in d.seen  # o_proj took the attention kernel's codes
    finally:
        set_dispatcher(old)
        fused_on_cpu(False)
        set_decode_attention(True, codes=False)
    n = model.config.num_hidden_layers  # the 5-token prefill and the step, on the fused path only
    assert calls == [(3, 5)] * n + [(3, 1)] * n
    torch.testing.assert_close(outs[True], outs[False], atol=0.1, rtol=0.05)


@pytest.mark.skipif(not GPU, reason="CUDA graphs")
def test_graphs_are_keyed_by_the_switches():
    """Turning the kernel off between steps must not replay graphs captured with it on."""
    from gearshift.kernels.switches import set_decode_attention
    from gearshift.model.tiny import build_random_model

    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (3, 4), device="cuda")

    def step(graphs):
        model.use_cuda_graphs = graphs
        cache = model.new_cache(3, 16)
        model(ids, cache, [0] * 3, [4] * 3, mode="w4a16")
        return model(ids[:, -1:], cache, [4] * 3, [1] * 3, mode="w4a16")

    try:
        captures = []
        for on in (True, False):
            set_decode_attention(on)
            eager = step(False)
            assert torch.equal(step(True), eager)  # graphed = eager under either setting
            captures.append(model._graphs.captures)
        assert captures[1] == 2 * captures[0]  # the second setting captured graphs of its own
    finally:
        set_decode_attention(True)
        model.use_cuda_graphs = False


def test_the_model_runs_it_from_the_min_batch_switch(monkeypatch):
    """One sequence's decode step attends with this kernel by default (stop 46); with
    `decode_attention_min_batch=2` it keeps SDPA, and the logits agree either way."""
    from gearshift.kernels import decode_attention as da
    from gearshift.kernels import switches
    from gearshift.model.tiny import build_random_model

    calls = []
    real = da.decode_attention_triton
    monkeypatch.setattr("gearshift.model.transformer.decode_attention_triton",
                        lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    torch.manual_seed(0)
    model = build_random_model("tiny", device=DEV, dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (1, 4), device=DEV)
    before = switches.state()
    outs = []
    try:
        switches.fused_on_cpu(True)
        for min_batch in (1, 2):
            switches.set_switches(decode_attention_min_batch=min_batch)
            calls.clear()
            cache = model.new_cache(1, 8)
            model(ids, cache, [0], [4])
            outs.append(model(ids[:, -1:], cache, [4], [1]))
            n = model.config.num_hidden_layers
            assert len(calls) == (2 * n if min_batch == 1 else 0)
    finally:
        switches.fused_on_cpu(False)
        switches.set_switches(**dict(before))
    torch.testing.assert_close(outs[0], outs[1], atol=0.05, rtol=0.05)


@pytest.mark.parametrize("b,t", [(3, 3), (12, 1), (4, 1)])
def test_x_tile_outputs_are_the_rows_in_the_fragment_layout(b, t):
    """tiles=True: every token's output bits at its place in `x_tiles`' layout (the padding rows, which no
    fragment kernel output reads, are left unwritten)."""
    from gearshift.kernels.x_tiles import XTiles, to_x_tiles

    cap = 40
    q, k, v = _inputs(b, t, 8, 2, 32, cap, seed=5)
    slots = (torch.arange(b * t, device=DEV).view(b, t) % 30) + 3
    want, _ = decode_attention_triton(q, k, v, slots, 36, **SMALL)
    got, codes = decode_attention_triton(q, k, v, slots, 36, tiles=True, **SMALL)
    assert codes is None and isinstance(got, XTiles) and got.shape == (b, t, 256)
    assert got.data.shape == to_x_tiles(want.view(b * t, -1)).shape and torch.equal(got.rows(), want)
    with pytest.raises(ValueError, match="x-tile"):
        decode_attention_triton(q, k, v, slots, 36, qmax=127.0, tiles=True)
