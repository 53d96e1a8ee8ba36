"""The model's fused-kernel path on CPU under the Triton interpreter: the residual adds inside the
RMSNorms, RoPE with the KV write, SwiGLU, and the activation codes the norms and SwiGLU emit for
the linears whose kernel takes them. On a GPU the same path runs on CUDA tensors (benchmarks/fused_check.py)."""

import os

import pytest
import torch

from gearshift.kernels._triton import HAS_TRITON

if not HAS_TRITON or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1, the CPU default in conftest)",
                allow_module_level=True)

from gearshift.dispatch import Dispatcher, get_dispatcher, set_dispatcher  # noqa: E402
from gearshift.kernels.act_quant import CodesSpec, codes_qmax, quantize_act_triton  # noqa: E402
from gearshift.kernels.reference import linear_reference  # noqa: E402
from gearshift.kernels.switches import fused_on_cpu, set_swiglu_codes  # noqa: E402
from gearshift.model.tiny import build_random_model  # noqa: E402


class CodesDispatcher(Dispatcher):
    """Takes codes wherever the activations are integers per token, as int8 (`w4a8_progressive`)
    or as exact integers in the activations' dtype (`w4a8_mma`, float=True), and checks each set
    against the quantizer; records which linears got them."""

    def __init__(self, float_codes=False):
        self.seen = []
        self.float_codes = float_codes

    def codes_qmax(self, store, act, m):
        return codes_qmax(act)

    def codes_for(self, store, act, m, dtype):
        qmax = codes_qmax(act)
        return None if qmax is None else CodesSpec(qmax, dtype if self.float_codes else torch.int8)

    def linear(self, x, store, act, bias=None, codes=None):
        self.seen.append((store.out_features, store.in_features, codes is not None))
        if codes is not None:
            x2 = x.reshape(-1, x.shape[-1])
            q, s = quantize_act_triton(x2, act, codes_dtype=x2.dtype if self.float_codes else torch.int8)
            assert codes.codes.dtype == q.dtype and torch.equal(codes.codes, q) and torch.equal(codes.scales, s)
        return linear_reference(x, store, act, bias)

    def linear_codes(self, codes, store, act, bias, dtype):
        """SwiGLU stored only the codes (their bits are checked in test_kernels_silu_mul.py)."""
        self.seen.append((store.out_features, store.in_features, True))
        assert codes.codes.dtype == (dtype if self.float_codes else torch.int8)
        return super().linear_codes(codes, store, act, bias, dtype)


@pytest.fixture(params=[False, True], ids=["int8-codes", "float-codes"])
def codes_dispatcher(request):
    old, d = get_dispatcher(), CodesDispatcher(request.param)
    set_dispatcher(d)
    yield d
    set_dispatcher(old)
    fused_on_cpu(False)


def _prefill_and_step(model, ids, mode):
    cache = model.new_cache(ids.shape[0], 32)
    b, t = ids.shape
    first = model(ids, cache, [0] * b, [t] * b, mode=mode)
    step = model(ids[:, -1:], cache, [t] * b, [1] * b, mode=mode)  # a decode step at an offset
    return first, step, cache


@pytest.fixture(params=[64, 1], ids=["swiglu-codes-from-64", "swiglu-codes-always"])
def swiglu_min_rows(request):
    set_swiglu_codes(True, request.param)
    yield request.param
    set_swiglu_codes(True, 1)


@pytest.mark.parametrize("mode", ["w4a16", "w4a8", "w4a4"])
def test_fused_path_matches_the_torch_ops(codes_dispatcher, swiglu_min_rows, mode):
    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cpu", dtype=torch.float32)
    ids = torch.randint(0, 512, (2, 7))
    ref_first, ref_step, ref_cache = _prefill_and_step(model, ids, mode)
    assert not any(c for *_, c in codes_dispatcher.seen)  # the torch path hands out no codes
    codes_dispatcher.seen.clear()
    fused_on_cpu(True)
    first, step, cache = _prefill_and_step(model, ids, mode)
    for a, b in ((first, ref_first), (step, ref_step), (cache.k, ref_cache.k), (cache.v, ref_cache.v)):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)
    assert torch.equal(first.argmax(-1), ref_first.argmax(-1))
    cfg = model.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    qkv = ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd, cfg.hidden_size)
    gate_up = (2 * cfg.intermediate_size, cfg.hidden_size)
    down = (cfg.hidden_size, cfg.intermediate_size)
    got = {(n, k) for n, k, c in codes_dispatcher.seen if c}
    if mode == "w4a16":
        assert got == set()
    else:  # the RMSNorms feed qkv and gate_up, SwiGLU feeds down (from its row threshold: the
        # prefill has 14 rows, the step 2); o quantizes its own inputs
        fed_down = [rows >= swiglu_min_rows for rows in (ids.numel(), ids.shape[0])]
        assert got == ({qkv, gate_up, down} if any(fed_down) else {qkv, gate_up})
        per_layer = [3 if f else 2 for f in fed_down]
        assert sum(c for *_, c in codes_dispatcher.seen) == sum(per_layer) * cfg.num_hidden_layers


def test_observed_down_proj_gets_the_stored_product(codes_dispatcher):
    """With a forward hook on down_proj (calibration's statistics) SwiGLU stores the product and
    down_proj's forward sees it; without one only the codes are made. Same outputs either way."""
    set_swiglu_codes(True, 1)
    try:
        torch.manual_seed(0)
        model = build_random_model("tiny", weights="int4", device="cpu", dtype=torch.float32)
        ids = torch.randint(0, 512, (2, 7))
        fused_on_cpu(True)
        plain, *_ = _prefill_and_step(model, ids, "w4a8")
        seen = []
        down = model.model.layers[0].mlp.down_proj
        hook = down.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape))
        try:
            assert down.observed()
            hooked, *_ = _prefill_and_step(model, ids, "w4a8")
        finally:
            hook.remove()
        assert not down.observed()
        assert seen and seen[0][-1] == model.config.intermediate_size
        assert torch.equal(hooked, plain)
    finally:
        set_swiglu_codes(True, 1)


class TilesAskDispatcher(Dispatcher):
    """Records which linears (by shape) the model asks whether their kernel reads `x_tiles`' layout; says no."""

    def __init__(self):
        self.asked = []

    def x_tiles_for(self, store, act, m, dtype):
        self.asked.append(((store.out_features, store.in_features), m))
        return False


@pytest.mark.parametrize("linears", ["qkv+o+gate_up+down", "qkv+down", ""])
def test_producers_ask_for_x_tiles_only_for_the_switched_linears(linears):
    """The model asks for x tiles only at the token counts and for the linears the switches name
    (`x_tiles_from`, `x_tiles_linears`: the A/Bs of which producers pay): each layer's producers, and once per
    pass for the first layer's four (`writes_x_tiles`, for the PDL rule); o's own producer, decode attention, is
    not on this fp32 path."""
    from collections import Counter

    from gearshift.kernels import switches

    old, d = get_dispatcher(), TilesAskDispatcher()
    before = switches.state()
    set_dispatcher(d)
    try:
        model = build_random_model("tiny", weights="int4", device="cpu", dtype=torch.float32)
        cfg = model.config
        hd = cfg.hidden_size // cfg.num_attention_heads
        qkv = ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd, cfg.hidden_size)
        shapes = {"qkv": qkv, "o": (cfg.hidden_size, cfg.num_attention_heads * hd),
                  "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
                  "down": (cfg.hidden_size, cfg.intermediate_size)}
        layers = cfg.num_hidden_layers
        named = [n for n in linears.split("+") if n]
        fused_on_cpu(True)
        ids = torch.randint(0, 512, (2, 3))
        for start, passes in ((2, (6, 2)), (3, (6,))):  # 6 prefill rows, then a 2-row step
            d.asked.clear()
            switches.set_switches(x_tiles_linears=linears, x_tiles_from=start)
            _prefill_and_step(model, ids, "w4a16")
            want = Counter({(shapes[n], m): 1 + (layers if n != "o" else 0) for n in named for m in passes})
            assert Counter(d.asked) == want, start
    finally:
        set_dispatcher(old)
        fused_on_cpu(False)
        switches.set_switches(**dict(before))
