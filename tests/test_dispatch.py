"""Dispatcher, strategy registry and policy map: CPU-only (no timing, no GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from gearshift.dispatch import AdaptiveDispatcher, Dispatcher, PolicyMap, get_dispatcher, run_linear, set_dispatcher
from gearshift.dispatch.policy import M_BUCKETS, Choice, candidate_name, load_policy_for_device, type_key
from gearshift.dispatch.profiler import ablations, model_shapes, shapes_from_config
from gearshift.dispatch.strategies import STRATEGIES, mode_key, rule_strategy, strategies_for
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.int4 import quantize_int4
from gearshift.quant.int8 import quantize_int8


def test_cpu_path_is_reference():
    torch.manual_seed(0)
    st = quantize_int4(torch.randn(32, 128), 64)
    x = torch.randn(2, 3, 128)
    for act in (None, ActQuantSpec("int8"), ActQuantSpec("int4", 32)):
        assert torch.equal(run_linear(x, st, act), linear_reference(x, st, act))
    assert isinstance(get_dispatcher(), AdaptiveDispatcher)


def test_unknown_act_object_falls_back():
    class OutlierQuant:  # another engineer's activation quantizer (not an ActQuantSpec)
        pass

    st = quantize_int8(torch.randn(16, 64))
    x = torch.randn(4, 64)
    d = AdaptiveDispatcher(PolicyMap("x"), autoload=False)
    called = {}

    import gearshift.dispatch.dispatcher as dm

    orig = dm.linear_reference

    def spy(*a, **k):
        called["yes"] = True
        return orig(x, st, None)

    dm.linear_reference = spy
    try:
        d.linear(x, st, OutlierQuant())
    finally:
        dm.linear_reference = orig
    assert called


def test_mode_keys_and_registry():
    st4 = quantize_int4(torch.randn(8, 64), 32)
    st8 = quantize_int8(torch.randn(8, 64))
    assert mode_key(st4, None) == "w4a16"
    assert mode_key(st4, ActQuantSpec("int8")) == "w4a8"
    assert mode_key(st4, ActQuantSpec("fp8")) == "w4a8fp8"
    assert mode_key(st4, ActQuantSpec("int4")) == "w4a4"
    assert mode_key(st8, ActQuantSpec("int8")) == "w8a8"
    names = {s.name for s in strategies_for("w4a8")}
    assert {"w4a8_pad", "w4a8_split", "w4a8_bitwise", "dequant_cublas"} <= names
    for s in STRATEGIES.values():
        assert s.dpr.family in ("padding", "split", "bitwise", "library")
    assert rule_strategy("w4a8", 1) == "w4a8_bitwise"
    assert rule_strategy("w4a8", 32) == "w4a8_split"
    assert rule_strategy("w4a8", 65) == "w4a8_pad"


def _toy_map():
    pm = PolicyMap("Toy GPU")
    key = type_key("w4a16", 128, 4096, 4096)
    cfg = TileConfig(16, 64, 256, 4)
    pm.set(key, 1, Choice("w4a16_tc", cfg, 5.0))
    pm.set(key, 16, Choice("w4a16_tc", cfg, 6.0))
    pm.set(key, 4096, Choice("dequant_cublas", None, 900.0))
    pm.timings[key] = {"1": {candidate_name("w4a16_tc", cfg): 5.0, "dequant_cublas": 40.0},
                       "4096": {candidate_name("w4a16_tc", cfg): 1000.0, "dequant_cublas": 900.0}}
    return pm, key


def test_policy_lookup_buckets_and_roundtrip(tmp_path):
    pm, key = _toy_map()
    assert pm.lookup(key, 1).strategy == "w4a16_tc"
    assert pm.lookup(key, 9).us == 6.0  # rounds up to bucket 16
    assert pm.lookup(key, 3000).strategy == "dequant_cublas"  # bucket 4096
    assert pm.lookup(key, 100000).strategy == "dequant_cublas"  # clipped to the largest
    assert pm.lookup(key, 200).strategy in ("w4a16_tc", "dequant_cublas")  # nearest filled bucket
    assert pm.lookup("w4a8:g128:1x1", 1) is None
    p = pm.save(tmp_path / "p.json")
    pm2 = PolicyMap.load(p)
    assert pm2.lookup(key, 16).config == TileConfig(16, 64, 256, 4)
    assert json.loads(p.read_text())["device"] == "Toy GPU"
    assert pm.without("w4a16_tc").lookup(key, 1).strategy == "dequant_cublas"


def test_load_policy_for_device(tmp_path, monkeypatch):
    pm, _ = _toy_map()
    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    assert load_policy_for_device("Toy GPU") is None
    pm.save(tmp_path / "cache" / "policy" / "Toy_GPU.json")
    assert load_policy_for_device("Toy GPU").device == "Toy GPU"
    assert load_policy_for_device("Other GPU") is None
    model = tmp_path / "model"
    PolicyMap("Toy GPU", meta={"beside": True}).save(model / "policy" / "Toy_GPU.json")
    assert load_policy_for_device("Toy GPU", model).meta == {"beside": True}


def test_damaged_policy_maps_are_named_and_skipped(tmp_path, monkeypatch):
    """A map file that is not a policy map raises ValueError naming the file (whatever its JSON holds),
    and the engine's lookup skips a damaged one with a warning and takes the next place's map."""
    import warnings

    from gearshift.dispatch.policy import PolicyMapWarning

    for text in ("{", "[]", '{"version": 1}', '{"device": 3, "buckets": "x"}'):
        (tmp_path / "m.json").write_text(text)
        with pytest.raises(ValueError, match="m.json is not a gearshift policy map"):
            PolicyMap.load(tmp_path / "m.json")
    pm, _ = _toy_map()
    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    pm.save(tmp_path / "cache" / "policy" / "Toy_GPU.json")
    model = tmp_path / "model"
    (model / "policy").mkdir(parents=True)
    (model / "policy" / "Toy_GPU.json").write_text('{"truncated": ')
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = load_policy_for_device("Toy GPU", model)
    assert got.device == "Toy GPU" and got.path == str(tmp_path / "cache" / "policy" / "Toy_GPU.json")
    assert [w.category for w in seen] == [PolicyMapWarning] and "Toy_GPU.json" in str(seen[0].message)


def test_ablations_from_timings():
    pm, key = _toy_map()
    shapes = [("o", 4096, 4096)]
    ab = ablations(pm, shapes, 2, "w4a16", m_list=[1, 4096])
    assert ab["1"]["map"] == 10.0 and ab["1"]["only:dequant_cublas"] == 80.0
    assert ab["4096"]["map"] == 1800.0 and ab["4096"]["without:dequant_cublas"] == 2000.0
    assert ab["4096"]["adangel_r"] == 1800.0


def test_model_shapes():
    shapes, layers = model_shapes("llama3-8b")
    assert layers == 32 and ("down", 4096, 14336) in shapes
    cfg = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}
    assert shapes_from_config(cfg)[0] == ("qkv", 6144, 4096)


def test_static_dispatcher_choice():
    st = quantize_int4(torch.randn(64, 256), 128)
    d = AdaptiveDispatcher(None, autoload=False, static="w4a8_split")
    c = d.choose(st, ActQuantSpec("int8"), 4)
    assert c.strategy == "w4a8_split" and c.config is not None
    assert d.choose(st, None, 4) is None  # not a w4a16 strategy


def test_set_dispatcher_roundtrip():
    old = get_dispatcher()
    try:
        set_dispatcher(Dispatcher())
        assert get_dispatcher().name == "reference"
    finally:
        set_dispatcher(old)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_dispatch_matches_reference():
    st = quantize_int4(torch.randn(256, 512), 128).cuda()
    for m in (1, 40, 300):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        for act in (None, ActQuantSpec("int8")):
            y = run_linear(x, st, act)
            ref = linear_reference(x.float(), st, act)
            assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_linear_from_codes_alone_is_the_linear_of_their_activations():
    """A producer that stored only the codes (SwiGLU for down, `QuantLinear.forward_codes`): on
    CPU the reference on the dequantized codes, which is `linear` of the activations they came from;
    codes of another range are refused, as is a dispatcher installed without the method."""
    from gearshift.dispatch import run_linear_codes
    from gearshift.errors import GearshiftError
    from gearshift.kernels.act_quant import ActCodes
    from gearshift.quant.activations import quantize_activations

    st = quantize_int4(torch.randn(64, 256), 128)
    act = ActQuantSpec("int8")
    x = torch.randn(5, 256)
    q, s = quantize_activations(x, act)
    codes = ActCodes(q, s.reshape(-1), 127.0)
    for d in (Dispatcher(), AdaptiveDispatcher(None, autoload=False)):
        assert torch.equal(d.linear_codes(codes, st, act, None, torch.float32), d.linear(x, st, act))
        with pytest.raises(GearshiftError, match="range"):
            d.linear_codes(ActCodes(q, s.reshape(-1), 7.0), st, act, None, torch.float32)
    with pytest.raises(GearshiftError, match="range"):
        Dispatcher().linear_codes(codes, st, None, None, torch.float32)

    class Old:  # a dispatcher from before codes-only calls
        name = "old"

    before = get_dispatcher()
    set_dispatcher(Old())
    try:
        with pytest.raises(GearshiftError, match="takes no activation codes"):
            run_linear_codes(codes, st, act, None, torch.float32)
    finally:
        set_dispatcher(before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 16, 64, 300])
def test_gpu_linear_from_codes_alone_gives_the_same_bits(m):
    """Where `codes_for` asks for codes, the codes-only call runs the same kernel on the same codes
    as `linear` with them, so the bits are the same."""
    from gearshift.kernels.act_quant import quantize_for
    from gearshift.quant.int4 import quantize_int4_progressive

    d = AdaptiveDispatcher()
    act = ActQuantSpec("int8")
    for st in (quantize_int4(torch.randn(4096, 4096), 128).cuda(), quantize_int4_progressive(
            torch.randn(4096, 4096), 128).cuda()):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        spec = d.codes_for(st, act, m, x.dtype)
        if spec is None:
            continue
        codes = quantize_for(x, act, spec)
        assert torch.equal(d.linear_codes(codes, st, act, None, x.dtype), d.linear(x, st, act, codes=codes))


def test_small_m_choices_prefer_the_fragment_kernels():
    d = AdaptiveDispatcher(None, autoload=False)
    st = quantize_int4(torch.randn(256, 1024), 128)
    for m in (1, 7, 16):
        assert d.choose(st, None, m).strategy == "w4a16_mma"
        for act in (ActQuantSpec("int8"), ActQuantSpec("int4")):  # int8 codes on the int8 MMA
            assert d.choose(st, act, m).strategy == "w4a8_mma_int8"
        assert d.choose(st, ActQuantSpec("fp8"), m).strategy == "w4a8_mma"  # e4m3 codes: as bf16
    assert d.choose(st, None, 17).strategy != "w4a16_mma"
    grouped = d.choose(st, ActQuantSpec("int8", 32), 1)
    assert grouped is None or not grouped.strategy.startswith("w4a8_mma")
    gguf_like = quantize_int4(torch.randn(64, 256), 32)  # groups of 32: dequantize-first fragments
    for m in (1, 4, 16):
        assert d.choose(gguf_like, None, m).strategy == "w4a16_mma"
        assert d.choose(gguf_like, ActQuantSpec("int8"), m).strategy == "w4a8_mma"  # 16-bit codes
    assert d.choose(gguf_like, None, 17).strategy == "dequant_cublas"  # a small weight (SMALL_WEIGHT)
    big = quantize_int4(torch.randn(2048, 1152), 32)
    for m in (17, 64):
        assert d.choose(big, None, m).strategy == "w4a16_mma"
        assert d.choose(big, ActQuantSpec("int8"), m).strategy == "w4a8_mma"
    assert d.choose(big, None, 65).strategy != "w4a16_mma"
    odd = quantize_int4(torch.randn(64, 576), 32)  # K not whole 128-column blocks (SmolLM2): other kernels
    assert d.choose(odd, None, 1).strategy in ("w4a16_fma", "w4a16_tc")


def test_stale_map_does_not_override_small_m():
    st = quantize_int4(torch.randn(256, 1024), 128)
    key = type_key("w4a16", 128, 256, 1024)
    tc = candidate_name("w4a16_tc", TileConfig(16, 64, 256, 4, 4, 4))
    old = PolicyMap("dev", timings={key: {str(m): {tc: 10.0} for m in M_BUCKETS}}).without("-")  # entries from timings
    assert AdaptiveDispatcher(old, autoload=False).choose(st, None, 1).strategy == "w4a16_mma"
    assert AdaptiveDispatcher(old, autoload=False).choose(st, None, 64).strategy == "w4a16_tc"
    mma = candidate_name("w4a16_mma", TileConfig(16, 0, 128, 2, 4, 1))
    new = PolicyMap("dev", timings={key: {str(m): {tc: 10.0, mma: 20.0} for m in M_BUCKETS}}).without("-")
    assert AdaptiveDispatcher(new, autoload=False).choose(st, None, 1).strategy == "w4a16_tc"  # the map decides


def test_bundled_h100_map_is_found_and_current(tmp_path, monkeypatch):
    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path))  # empty user cache
    pm = load_policy_for_device("NVIDIA H100 80GB HBM3")
    assert pm is not None and "data/policy" in pm.path.replace("\\", "/")
    assert load_policy_for_device("Some Other GPU") is None
    st = quantize_int4(torch.randn(6144, 4096), 128)
    d = AdaptiveDispatcher(pm, autoload=False)
    c = d.choose(st, None, 1)
    assert c.strategy == "w4a16_mma" and c.config.split_k >= 1  # a profiled tile, not the heuristic default
    assert not d._stale_small_m(pm, "w4a16", 1)  # its entries name the fragment kernels


def test_bundled_maps_name_registered_strategies():
    """A shipped map must only name strategies (and tile fields) this version still has."""
    from gearshift.dispatch.policy import bundled_dir

    maps = sorted(bundled_dir().glob("*.json"))
    assert maps, "the package ships at least the H100 map"
    for path in maps:
        pm = PolicyMap.load(path)
        for key, row in pm.entries.items():
            for c in row:
                if c is not None:
                    assert c.strategy in STRATEGIES, (path.name, key, c.strategy)
                    assert c.config is None or isinstance(c.config, TileConfig)


def test_step_cost_sums_the_map_and_proxies_w4a4():
    from types import SimpleNamespace as NS

    from gearshift.dispatch.step_cost import linear_step_us

    lins = [("a", NS(store=NS(out_features=256, in_features=512, group_size=128, weight_bits=4))),
            ("b", NS(store=NS(out_features=512, in_features=256, group_size=128, weight_bits=4))),
            ("lm_head", NS(store=NS(out_features=9, in_features=9, group_size=0, weight_bits=16)))]
    pm = PolicyMap("Toy GPU")
    for (n, k), us in (((256, 512), 3.0), ((512, 256), 4.0)):
        pm.set(type_key("w4a8", 128, n, k), 1, Choice("w4a8_mma", None, us))
    assert linear_step_us(pm, lins, "w4a8", 1) == 7.0  # lm_head left out
    assert linear_step_us(pm, lins, "w4a4", 1) == 7.0  # same kernels as w4a8 when w4a4 was not profiled
    assert linear_step_us(pm, lins, "w4a16", 1) is None


def test_bundled_map_choices_can_run_their_shapes():
    """Every int4 entry of a shipped map is supported by its strategy on a store of that shape, in
    both int4 layouts (with row units where the strategy needs them, `w4a8_progressive`); an
    unsupported entry would make the dispatcher fall back silently. Plain stores at such an entry
    get a timed candidate of the map that they can run, never the rule default."""
    import re

    from gearshift.dispatch.policy import bundled_dir
    from gearshift.kernels.w4a16_wgmma import HAS_GLUON
    from gearshift.quant.int4 import BLOCKS16, ROWS, Int4Weight
    from gearshift.quant.modes import MODES

    for path in sorted(bundled_dir().glob("*.json")):
        pm = PolicyMap.load(path)
        for key, row in pm.entries.items():
            mt = re.fullmatch(r"(w4a(?:16|8|8fp8|4)):g(\d+):(\d+)x(\d+)", key)
            if mt is None:
                continue
            mode, g, n, k = mt.group(1), int(mt.group(2)), int(mt.group(3)), int(mt.group(4))
            for layout in (ROWS, BLOCKS16):
                def store(units):
                    return Int4Weight(torch.empty(n, k // 2, dtype=torch.uint8),
                                      torch.ones(n, k // g, dtype=torch.float16),
                                      torch.zeros(n, k // g, dtype=torch.float16), g, layout=layout, row_units=units)

                st, prog = store(None), store(torch.ones(n))
                dispatcher = AdaptiveDispatcher(pm, autoload=False)
                for m, c in zip(pm.buckets, row):
                    if c is None or (c.strategy.endswith(("_wgmma", "_progressive")) and not HAS_GLUON):
                        continue
                    act = MODES[mode].act
                    if c.strategy == "w4a8_progressive":
                        assert STRATEGIES[c.strategy].supports(prog, act, c.config), (path.name, key, m, layout)
                        alt = dispatcher.choose(st, act, m)
                        assert alt is not None and alt.us is not None, (path.name, key, m, layout)
                        assert STRATEGIES[alt.strategy].supports(st, act, alt.config)
                        continue
                    assert STRATEGIES[c.strategy].supports(st, act, c.config), (path.name, key, m, layout)


def test_map_pick_a_store_cannot_run_falls_to_its_best_timed_alternative():
    """A map profiled on stores with row units picks `w4a8_progressive`; a plain int4 store at the
    same shape gets the fastest candidate the map timed that it can run, not the rule default."""
    from gearshift.dispatch.profiler import random_store
    from gearshift.kernels.w4a8_progressive import HAS_GLUON, progressive_configs

    if not HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    act = ActQuantSpec("int8")
    key = type_key("w4a8", 128, 256, 1024)
    prog = candidate_name("w4a8_progressive", progressive_configs(256)[0])
    pad = candidate_name("w4a8_pad", TileConfig(128, 128, 128, 1, 8, 3, True, True))
    slow = candidate_name("w4a8_split", TileConfig(64, 64, 64, 1, 4, 3, True, True))
    pm = PolicyMap("dev", timings={key: {str(m): {prog: 5.0, pad: 7.0, slow: 9.0} for m in M_BUCKETS}}).without("-")
    d = AdaptiveDispatcher(pm, autoload=False)
    assert d.choose(random_store("int4p", 256, 1024, 128, "cpu"), act, 256).strategy == "w4a8_progressive"
    plain = random_store("int4", 256, 1024, 128, "cpu")
    for _ in range(2):  # the second call comes from the memo
        c = d.choose(plain, act, 256)
        assert c.strategy == "w4a8_pad" and c.config.bm == 128


def test_codes_are_asked_for_only_where_a_kernel_takes_them():
    """On CPU (the torch reference) nothing asks a norm for quantized activations, and codes handed
    in anyway do not change the result; only w4a8_progressive and w4a8_mma_int8 take them, for
    integer per-token activations (as int8), and w4a8_mma (as exact integers in the activations' dtype)."""
    from gearshift.kernels.act_quant import ActCodes, codes_qmax, quantize_act_reference
    from gearshift.model.quant_linear import QuantLinear
    from gearshift.quant.int4 import quantize_int4_progressive

    takes = {s.name: s.codes_float for s in STRATEGIES.values() if s.run_codes is not None}
    assert takes == {"w4a8_progressive": False, "w4a8_mma": True, "w4a8_mma_int8": False}
    assert codes_qmax(ActQuantSpec("int8")) == 127.0 and codes_qmax(ActQuantSpec("int4")) == 7.0
    assert codes_qmax(ActQuantSpec("fp8")) is None and codes_qmax(ActQuantSpec("int8", 128)) is None
    assert codes_qmax(None) is None
    torch.manual_seed(0)
    lin = QuantLinear(quantize_int4_progressive(torch.randn(64, 256), 128))
    x = torch.randn(3, 256)
    for mode in ("w4a16", "w4a8", "w4a4"):
        assert lin.codes_qmax(mode, 3) is None and lin.codes_for(mode, 3, torch.float32) is None
    q, s = quantize_act_reference(x, ActQuantSpec("int8"))
    junk = ActCodes(torch.zeros_like(q), torch.ones_like(s), 127.0)  # would give zeros if it were used
    assert torch.equal(lin(x, "w4a8", junk), lin(x, "w4a8"))
    assert Dispatcher().codes_qmax(lin.store, ActQuantSpec("int8"), 128) is None
    assert Dispatcher().codes_for(lin.store, ActQuantSpec("int8"), 128, torch.bfloat16) is None


def test_profiler_never_times_a_wrong_kernel():
    """The profiler compares every candidate with the torch reference before timing it: a kernel
    that returns zeros or NaN is logged and left out of the map even if the timer calls it fastest."""
    from gearshift.dispatch.profiler import profile
    from gearshift.dispatch.strategies import DPRPartition, Strategy, register

    fakes = {"test_right": lambda x, st, act, cfg: linear_reference(x.float(), st, act).to(x.dtype),
             "test_zeros": lambda x, st, act, cfg: torch.zeros(x.shape[0], st.out_features, dtype=x.dtype),
             "test_nan": lambda x, st, act, cfg: torch.full((x.shape[0], st.out_features), float("nan"))}
    for name, run in fakes.items():
        register(Strategy(name, DPRPartition((4,), (16,), "any", "library"), ("w4a16",), run, gpu_only=False))

    def timer(calls):  # wrong kernels look 5x faster
        y = calls[0]()
        return 1.0 if not torch.isfinite(y).all() or not y.any() else 5.0

    logged = []
    try:
        pm = profile([("s", 64, 256)], ["w4a16"], [1, 4], group=128, device_name="test", strategies=list(fakes),
                     dtype=torch.float32, log=logged.append, int4_layout="rows", timer=timer, device="cpu")
    finally:
        for name in fakes:
            STRATEGIES.pop(name)
    key = type_key("w4a16", 128, 64, 256)
    assert [pm.lookup(key, m).strategy for m in (1, 4)] == ["test_right", "test_right"]
    times = pm.timings[key]["1"]
    assert times["test_right"] == 5.0 and times["test_zeros"] is None and times["test_nan"] is None
    assert sum("wrong result" in line for line in logged) == 4


def test_profile_times_large_m_after_sustained_running_only():
    """From sustain_from_m tokens the profiler asks its timer for a sustained timing (the clocks a
    whole large step runs at under the power cap); below it, and with sustain_s=0, it does not."""
    from gearshift.dispatch.profiler import profile
    from gearshift.dispatch.strategies import DPRPartition, Strategy, register

    names = ("test_sustain", "test_other")
    for name in names:
        register(Strategy(name, DPRPartition((4,), (16,), "any", "library"), ("w4a16",),
                          lambda x, st, act, cfg: linear_reference(x.float(), st, act).to(x.dtype), gpu_only=False))
    asked = []

    def timer(calls, sustain_s=0.0):
        asked.append((calls[0]().shape[0], sustain_s))
        return 1.0

    def run(sustain_s, strategies=names, policy=None):
        asked.clear()
        pm = profile([("s", 64, 256)], ["w4a16"], [4, 32], group=128, device_name="test", strategies=list(strategies),
                     dtype=torch.float32, int4_layout="rows", timer=timer, device="cpu", policy=policy,
                     sustain_s=sustain_s, sustain_from_m=32)
        return sorted(set(asked)), pm

    key = type_key("w4a16", 128, 64, 256)
    try:
        seen, pm = run(0.25)
        assert seen == [(4, 0.0), (32, 0.25)]  # 4 tokens timed plain, 32 sustained
        assert pm.meta["sustained_points"] == [f"{key} M=32"]
        # a burst re-profile of one strategy: at 32 tokens the sustained timings do not compare, so they go
        seen, pm = run(0.0, strategies=names[:1], policy=pm)
        assert seen == [(4, 0.0), (32, 0.0)]
        assert sorted(pm.timings[key]["4"]) == sorted(names) and list(pm.timings[key]["32"]) == ["test_sustain"]
        assert "sustained_points" not in pm.meta
    finally:
        for name in names:
            STRATEGIES.pop(name)


def _arch_map(device: str, cap: str | None, sms: int | None, triton: str | None = None) -> PolicyMap:
    meta = {} if cap is None else {"capability": cap, "sms": sms}
    if triton:
        meta["triton"] = triton
    return PolicyMap(device, meta=meta)


def test_a_gpu_nobody_profiled_borrows_the_nearest_map_of_its_architecture(tmp_path, monkeypatch):
    """No map for this GPU: the map of the same compute capability with the nearest SM count runs
    (marked as borrowed), never one of another architecture or one that does not say its own; an
    exact map always wins; GEARSHIFT_POLICY_FALLBACK=0 turns borrowing off."""
    from gearshift.dispatch.policy import describe, same_architecture_map

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("gearshift.dispatch.policy.bundled_dir", lambda: tmp_path / "bundled")
    _arch_map("Big GPU", "9.0", 132).save(tmp_path / "bundled" / "Big_GPU.json")
    _arch_map("Cut GPU", "9.0", 114).save(tmp_path / "cache" / "policy" / "Cut_GPU.json")
    _arch_map("Old GPU", "8.0", 108).save(tmp_path / "cache" / "policy" / "Old_GPU.json")
    _arch_map("Mute GPU", None, None).save(tmp_path / "cache" / "policy" / "Mute_GPU.json")
    (tmp_path / "cache" / "policy" / "junk.json").write_text("[1, 2]")
    h = {"capability": "9.0", "sms": 132}
    pm = load_policy_for_device("New GPU", traits=h)
    assert pm.device == "Big GPU" and pm.borrowed_for == "New GPU" and "bundled" in pm.path
    assert "profiled on Big GPU" in describe(pm) and "sm_90" in describe(pm)
    assert load_policy_for_device("New GPU", traits={"capability": "9.0", "sms": 120}).device == "Cut GPU"
    assert load_policy_for_device("New GPU", traits={"capability": "8.9", "sms": 128}) is None
    assert load_policy_for_device("New GPU") is None  # no traits given: exact maps only
    assert load_policy_for_device("Cut GPU", traits=h).device == "Cut GPU"  # its own map first
    assert not hasattr(load_policy_for_device("Cut GPU", traits=h), "borrowed_for")
    model = tmp_path / "model"
    _arch_map("Model GPU", "9.0", 132).save(model / "policy" / "Model_GPU.json")
    assert same_architecture_map("New GPU", h, model).device == "Model GPU"  # beside the model first on a tie
    _arch_map("New GPU", None, None).save(tmp_path / "cache" / "policy" / "renamed.json")
    own = load_policy_for_device("New GPU", traits=h)  # its own map under another file name wins
    assert own.device == "New GPU" and own.path.endswith("renamed.json") and not hasattr(own, "borrowed_for")
    monkeypatch.setenv("GEARSHIFT_POLICY_FALLBACK", "0")
    assert load_policy_for_device("New GPU", traits=h) is None
    assert describe(None).startswith("built-in rules")


def test_the_shipped_h100_map_serves_other_hopper_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path))
    pm = load_policy_for_device("NVIDIA H800", traits={"capability": "9.0", "sms": 132})
    assert pm is not None and pm.device == "NVIDIA H100 80GB HBM3" and pm.borrowed_for == "NVIDIA H800"
    assert load_policy_for_device("NVIDIA A100-SXM4-80GB", traits={"capability": "8.0", "sms": 108}) is None


def test_the_shipped_h200_map_holds_its_own_points_and_the_h100s_for_the_rest(tmp_path, monkeypatch):
    """The H200's shipped map holds only the points it measured faster with its own picks; at
    load every other point comes from the H100's map, so the H200 runs every mode and M as before."""
    import gearshift.dispatch.policy as P

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path))
    h100 = load_policy_for_device("NVIDIA H100 80GB HBM3")
    own = PolicyMap.load(P.bundled_dir() / "NVIDIA_H200.json")
    pm = load_policy_for_device("NVIDIA H200", traits={"capability": "9.0", "sms": 132})
    assert pm.device == "NVIDIA H200" and not hasattr(pm, "borrowed_for")
    assert pm.filled_from[0]["device"] == "NVIDIA H100 80GB HBM3"
    assert pm.points() == h100.points() > own.points() > 0
    for key, row in h100.entries.items():
        for m, c in zip(h100.buckets, row):
            mine = own.lookup(key, m) if key in own.entries and own.entries[key][own.buckets.index(m)] else None
            assert pm.lookup(key, m) == (mine or c), (key, m)
    assert f"profiled on this GPU at {own.points()} of its" in P.describe(pm)


def test_a_map_of_some_points_takes_the_rest_from_its_architecture(tmp_path, monkeypatch):
    """A profile of a few M buckets or one mode on a GPU that borrowed a map must not hide the
    borrowed map's other points: its own picks win where it has them, the nearest other GPU's map
    fills the rest (with those points' timings), then the next one; FALLBACK=0 keeps the map as it is."""
    import gearshift.dispatch.policy as P

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("gearshift.dispatch.policy.bundled_dir", lambda: tmp_path / "bundled")
    key, other_key = type_key("w4a16", 128, 64, 256), type_key("w4a8", 128, 64, 256)
    mine, theirs, last = Choice("mine", None), Choice("theirs", None), Choice("last", None)
    big = _arch_map("Big GPU", "9.0", 132)
    for m in M_BUCKETS:
        big.set(key, m, theirs)
    big.set(other_key, 1, theirs)
    big.timings = {key: {"1": {"theirs": 3.0}, "4": {"theirs": 9.0}}}
    big.save(tmp_path / "bundled" / "Big_GPU.json")
    far = _arch_map("Far GPU", "9.0", 100)
    far.set(other_key, 2, last)
    far.set(other_key, 1, last)
    far.save(tmp_path / "bundled" / "Far_GPU.json")
    _arch_map("Old GPU", "8.0", 132).save(tmp_path / "bundled" / "Old_GPU.json")
    own = _arch_map("New GPU", "9.0", 132)
    own.set(key, 4, mine)
    own.timings = {key: {"4": {"mine": 1.0}}}
    own.save(tmp_path / "cache" / "policy" / "New_GPU.json")
    h = {"capability": "9.0", "sms": 132}
    pm = load_policy_for_device("New GPU", traits=h)
    assert pm.device == "New GPU" and not hasattr(pm, "borrowed_for")
    assert pm.lookup(key, 4) == mine and pm.lookup(key, 1) == theirs and pm.lookup(key, 4096) == theirs
    assert pm.lookup(other_key, 1) == theirs and pm.lookup(other_key, 2) == last  # the nearest GPU's first
    assert pm.timings[key] == {"4": {"mine": 1.0}, "1": {"theirs": 3.0}}  # its own timings kept
    assert [f["device"] for f in pm.filled_from] == ["Big GPU", "Far GPU"]
    assert "profiled on this GPU at 1 of its 15 points, the others on Big GPU and Far GPU" in P.describe(pm)
    assert big.timings[key]["1"] == {"theirs": 3.0} and PolicyMap.load(tmp_path / "cache" / "policy" /
                                                                     "New_GPU.json").points() == 1
    assert not hasattr(load_policy_for_device("New GPU"), "filled_from")  # no traits: the map as saved
    # a benchmark's map file: filled where it is this GPU's, as it is where it is another GPU's (a what-if)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "New GPU")
    monkeypatch.setattr(P, "gpu_traits", lambda *a: h)
    assert P.load_map_file(tmp_path / "cache" / "policy" / "New_GPU.json").points() == 15
    assert P.load_map_file(tmp_path / "bundled" / "Far_GPU.json").points() == 2
    monkeypatch.setenv("GEARSHIFT_POLICY_FALLBACK", "0")
    assert load_policy_for_device("New GPU", traits=h).points() == 1


def test_seeded_candidates_are_the_seeds_fastest_and_each_strategys_best():
    from gearshift.dispatch.profiler import seeded_candidates

    key = type_key("w4a16", 128, 64, 256)
    cfgs = [TileConfig(16, bn) for bn in (16, 32, 64, 128)]
    seed = PolicyMap("seed GPU", timings={key: {"1": {
        candidate_name("a", cfgs[0]): 1.0, candidate_name("a", cfgs[1]): 2.0, candidate_name("a", cfgs[2]): 3.0,
        candidate_name("a", cfgs[3]): None, candidate_name("b", cfgs[0]): 9.0, "c": 7.0}}})
    assert seeded_candidates(seed, key, 1, 2) == {("a", cfgs[0]), ("a", cfgs[1]), ("c", None), ("b", cfgs[0])}
    assert seeded_candidates(seed, key, 1, 1) == {("a", cfgs[0]), ("c", None), ("b", cfgs[0])}
    assert seeded_candidates(seed, key, 4, 2) is None  # never timed there: sweep everything
    assert seeded_candidates(seed, "w4a8:g128:1x1", 1, 2) is None
    # a shape the seed never timed: ranked by its nearest timed shape of the mode and group
    far = type_key("w4a16", 128, 8192, 8192)
    seed.timings[far] = {"1": {"d": 1.0}}
    assert seeded_candidates(seed, type_key("w4a16", 128, 96, 256), 1, 1) == seeded_candidates(seed, key, 1, 1)
    assert seeded_candidates(seed, type_key("w4a16", 128, 6000, 9000), 1, 1) == {("d", None)}
    assert seeded_candidates(seed, type_key("w4a16", 64, 96, 256), 1, 1) is None


def test_a_strategy_the_seed_has_no_pick_of_at_m_takes_its_nearest_buckets_best():
    """Not a full sweep of it (stop 51: ~150 fragment tiles at 32 and 64 tokens, where the seed had
    timed that kernel only at 16): its fastest tiles at the nearest M where the seed timed tiles of
    it that the sweep still has; a strategy the seed never timed anywhere, in full."""
    from types import SimpleNamespace

    from gearshift.dispatch.profiler import seeded_sweep

    key = type_key("w4a16", 128, 64, 256)
    cfgs = [TileConfig(16, bn) for bn in (16, 32, 64, 128)]
    a, b, c = (SimpleNamespace(name=n) for n in "abc")
    seed = PolicyMap("seed GPU", timings={key: {
        "32": {candidate_name("a", cfgs[0]): 1.0},
        "16": {candidate_name("b", cfgs[2]): 5.0, candidate_name("b", cfgs[1]): 4.0, candidate_name("b", cfgs[0]): 6.0},
        "4": {candidate_name("b", cfgs[3]): 1.0}}})  # faster, but farther from 32 than 16 is

    def picks(sweep, m=32, top=2):
        return {(s.name, cfg) for s, cfg in seeded_sweep(sweep, seed, key, m, top)}

    full = [(s, cfg) for s in (a, b, c) for cfg in cfgs]
    assert picks(full) == {("a", cfgs[0]), ("b", cfgs[1]), ("b", cfgs[2])} | {("c", cfg) for cfg in cfgs}
    assert picks([(b, cfgs[0]), (b, cfgs[3])]) == {("b", cfgs[0])}  # only the tiles the sweep still has
    assert picks([(a, cfgs[0]), (b, cfgs[3])]) == {("a", cfgs[0]), ("b", cfgs[3])}  # 16 has none of its tiles
    assert picks(full, m=8) == {(s.name, cfg) for s, cfg in full}  # the seed never timed M = 8: everything


@pytest.mark.parametrize("new_tiles", [False, True])
def test_a_seeded_profile_times_only_the_seeds_picks(new_tiles):
    """`gearshift profile --seed`: at a point the seed timed, only its picks run (and in full the
    strategies it has no pick of; with --new-tiles also the tiles it never timed); elsewhere the full
    sweep."""
    from gearshift.dispatch.profiler import profile
    from gearshift.dispatch.strategies import DPRPartition, Strategy, register

    cfgs = [TileConfig(16, bn) for bn in (16, 32, 64, 128)]  # the seed never timed the last
    ran = []

    def run(x, st, act, cfg):
        ran.append(cfg)
        return linear_reference(x.float(), st, act).to(x.dtype)

    register(Strategy("test_tiles", DPRPartition((4,), (16,), "any", "library"), ("w4a16",), run,
                      configs=lambda m: list(cfgs), gpu_only=False))
    register(Strategy("test_new", DPRPartition((4,), (16,), "any", "library"), ("w4a16",), run,
                      configs=lambda m: cfgs[:2], gpu_only=False))
    key = type_key("w4a16", 128, 64, 256)
    seed = PolicyMap("seed GPU", timings={key: {"1": {candidate_name("test_tiles", c): us
                                                       for c, us in zip(cfgs[:3], (3.0, 1.0, 2.0))}}})
    class Bar:  # what the CLI's tqdm bar is told: points done, and each point's candidate count
        def __init__(self):
            self.n, self.postfix = 0, []

        def update(self, k):
            self.n += k

        def set_postfix_str(self, text):
            self.postfix.append(text)

    bar = Bar()
    try:
        pm = profile([("s", 64, 256)], ["w4a16"], [1, 4], group=128, device_name="test", progress=bar,
                     strategies=["test_tiles", "test_new"], dtype=torch.float32, int4_layout="rows",
                     timer=lambda calls: float(len(ran)), device="cpu", seed=seed, top=1, new_tiles=new_tiles)
    finally:
        STRATEGIES.pop("test_tiles")
        STRATEGIES.pop("test_new")
    # the seed's pick of the strategy it timed (and with new_tiles the tile it never timed); the
    # strategy it never timed, in full
    assert set(pm.timings[key]["1"]) == {candidate_name("test_tiles", c)
                                         for c in ((cfgs[1], cfgs[3]) if new_tiles else (cfgs[1],))} | {
        candidate_name("test_new", c) for c in cfgs[:2]}
    assert len(pm.timings[key]["4"]) == 6  # the seed never timed M = 4
    assert pm.meta["seeded_from"] == {"device": "seed GPU", "top": 1}
    assert bar.n == 2 and bar.postfix == [f"{key} M=1: {len(pm.timings[key]['1'])} candidates",
                                          f"{key} M=4: 6 candidates"]


def test_a_seed_that_never_timed_a_shape_is_reported():
    from gearshift.dispatch.profiler import unseen_pairs

    key = type_key("w4a16", 128, 64, 256)
    seed = PolicyMap("seed GPU", timings={key: {"1": {"w4a16_tc": 1.0}}})
    assert unseen_pairs(seed, [("s", 64, 256)], ["w4a16"], 128) == ([], 1)
    # another shape of a timed mode is ranked by its nearest timed shape: only untimed modes are swept
    assert unseen_pairs(seed, [("s", 64, 256), ("t", 32, 256)], ["w4a16", "w4a8"], 128) == (
        ["w4a8:g128:64x256", "w4a8:g128:32x256"], 4)
    assert unseen_pairs(seed, [("s", 64, 256)], ["w4a16"], 64)[0] == ["w4a16:g64:64x256"]


def test_a_shape_the_map_never_saw_takes_the_nearest_profiled_shapes_pick():
    """Another model's (N, K): the nearest profiled shape of the same mode and group lends its pick
    (or its fastest timed candidate that runs this store), not the first-generation rule."""
    pm = PolicyMap("dev")
    near, far = type_key("w4a16", 128, 4096, 4096), type_key("w4a16", 128, 28672, 4096)
    tc = TileConfig(16, 64, 256, 4)
    pm.set(near, 256, Choice("dequant_cublas", None, 5.0))
    pm.set(far, 256, Choice("w4a16_tc", tc, 9.0))
    d = AdaptiveDispatcher(pm, autoload=False)
    st = quantize_int4(torch.randn(4608, 3584), 128)  # Qwen2.5-7B's qkv
    assert d.choose(st, None, 256).strategy == "dequant_cublas"
    assert d.choose(st, None, 256) == d.choose(st, None, 300)  # same bucket: served from the cache
    wide = quantize_int4(torch.randn(37888, 3584), 128)  # its gate_up: nearer the 28672-row shape
    assert d.choose(wide, None, 256) == Choice("w4a16_tc", tc, 9.0)
    from gearshift.dispatch.dispatcher import default_choice

    assert d.choose(st, ActQuantSpec("int8"), 256) == default_choice("w4a8", 256, 4608)  # no w4a8 in the map
    # a pick this store cannot run gives way to that shape's fastest candidate that can
    # 28 blocks: not 8 ways
    k8, k4 = TileConfig(16, 0, 128, 1, 8, 1, kwarps=8), TileConfig(16, 0, 128, 1, 8, 1, kwarps=4)
    odd = PolicyMap("dev", timings={near: {"1": {candidate_name("w4a16_mma", k8): 1.0,
                                                 candidate_name("w4a16_mma", k4): 3.0}}})
    odd.set(near, 1, Choice("w4a16_mma", k8, 1.0))
    assert AdaptiveDispatcher(odd, autoload=False).choose(st, None, 1) == Choice("w4a16_mma", k4, 3.0)


def test_the_shipped_map_serves_other_models_shapes(tmp_path, monkeypatch):
    """Qwen2.5-7B / Llama-2-7B shapes on the shipped H100 map: every M bucket gets a profiled
    kernel that runs the store (the rules would give first-generation kernels above 16 tokens)."""
    from gearshift.dispatch.dispatcher import default_choice

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path))
    d = AdaptiveDispatcher(load_policy_for_device("NVIDIA H100 80GB HBM3"), autoload=False)
    for n, k in ((4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944), (12288, 4096), (4096, 11008)):
        st = quantize_int4(torch.randn(n, k), 128)
        for m in (1, 16, 64, 256, 2048):
            c = d.choose(st, None, m)
            assert c is not None and c != default_choice("w4a16", m, n) and d._serves(c, st, None, m), (n, k, m, c)


def test_unprofiled_shapes_are_those_no_entry_covers():
    from gearshift.dispatch.policy import unprofiled_shapes

    pm = PolicyMap("dev")
    pm.set(type_key("w4a16", 128, 4096, 4096), 1, Choice("w4a16_tc", TileConfig(), 1.0))
    pm.set(type_key("w4a8", 128, 6144, 4096), 1, Choice("w4a16_tc", TileConfig(), 1.0))
    assert unprofiled_shapes(pm, [(4096, 4096), (6144, 4096), (4608, 3584), (4608, 3584)]) == [(4608, 3584)]
    assert unprofiled_shapes(pm, []) == []


def test_a_map_profiled_under_the_running_triton_release_comes_first(tmp_path, monkeypatch):
    """Tiles compile differently under another Triton release (stop 38: the H100 map's one-token
    W4A16 step took 1.08x as long under 3.9), so `<device>.triton<release>.json` is looked for before
    `<device>.json` at each place, a map from another release is said to be one, and borrowing
    prefers this release's map between equals."""
    from gearshift.dispatch import policy as P

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(P, "bundled_dir", lambda: tmp_path / "bundled")
    monkeypatch.setattr(P, "triton_version", lambda: "3.9.1")
    names = [p.name for p in P.policy_paths("Toy GPU")]
    assert names == ["Toy_GPU.triton3.9.json", "Toy_GPU.json"] * 2
    assert [p.name for p in P.policy_paths("Toy GPU", release="")] == ["Toy_GPU.json"] * 2
    _arch_map("Toy GPU", "9.0", 132, triton="3.6.0").save(tmp_path / "bundled" / "Toy_GPU.json")
    old = load_policy_for_device("Toy GPU")
    assert old.meta["triton"] == "3.6.0"
    note = P.toolchain_note(old)
    assert "Triton 3.6.0" in note and "Triton 3.9" in note and note in P.describe(old)
    assert P.toolchain_note(old, release="3.6") is None
    assert P.toolchain_note(PolicyMap("Toy GPU")) is None  # a map that does not say is not doubted
    _arch_map("Toy GPU", "9.0", 132, triton="3.9.0").save(tmp_path / "bundled" / "Toy_GPU.triton3.9.json")
    new = load_policy_for_device("Toy GPU")
    assert new.path.endswith("Toy_GPU.triton3.9.json") and P.toolchain_note(new) is None
    assert P.describe(new) == new.path
    _arch_map("Toy GPU", "9.0", 132, triton="3.9.0").save(tmp_path / "cache" / "policy" / "Toy_GPU.json")
    assert load_policy_for_device("Toy GPU").path.startswith(str(tmp_path / "cache"))  # the user's own map first
    borrowed = P.same_architecture_map("Other GPU", {"capability": "9.0", "sms": 132})
    assert borrowed.meta["triton"] == "3.9.0" and borrowed.borrowed_for == "Other GPU"
    monkeypatch.setattr(P, "triton_version", lambda: "3.6.0")
    assert P.same_architecture_map("Other GPU", {"capability": "9.0", "sms": 132}).meta["triton"] == "3.6.0"


def test_gzipped_maps_are_found_as_their_own_and_to_borrow(tmp_path, monkeypatch):
    """`PolicyMap.save` gzips a path ending in .gz, so a map kept as `<device>.json.gz` (in the cache, or
    beside a model) is this GPU's own map and another GPU's to borrow, as a plain one is."""
    from gearshift.dispatch import policy as P

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(P, "bundled_dir", lambda: tmp_path / "bundled")
    _arch_map("Toy GPU", "9.0", 132).save(tmp_path / "cache" / "policy" / "Toy_GPU.json.gz")
    own = load_policy_for_device("Toy GPU", traits={"capability": "9.0", "sms": 132})
    assert own.device == "Toy GPU" and own.path.endswith("Toy_GPU.json.gz")
    borrowed = P.same_architecture_map("Other GPU", {"capability": "9.0", "sms": 132})
    assert borrowed.device == "Toy GPU" and borrowed.borrowed_for == "Other GPU"


def test_the_triton_39_h100_map_differs_from_the_generic_one_only_where_it_was_re_profiled():
    from gearshift.dispatch.policy import bundled_dir

    base = PolicyMap.load(bundled_dir() / "NVIDIA_H100_80GB_HBM3.json")
    t39 = PolicyMap.load(bundled_dir() / "NVIDIA_H100_80GB_HBM3.triton3.9.json")
    assert base.meta["triton"].startswith("3.6") and t39.meta["triton"].startswith("3.9")
    changed = {(key, m) for key in t39.entries for m in base.buckets
               if t39.lookup(key, m) != base.lookup(key, m)}
    # 3.9's own W4A16 profile at 1-2 tokens (stop 38); elsewhere each map took the xshare tiles (stop 41,
    # 8 / 16 tokens) and the shared-memory K-sum tiles (stop 42, 1..16 tokens) that won under its own
    # release (1..32 tokens), so they differ only at 1..32 tokens, and past stop 38's points only where
    # one side holds such a tile
    assert changed and {m for _, m in changed} <= {1, 2, 4, 8, 16, 32}
    flagged = {(key, m) for key, m in changed
               if any(c.config is not None and (c.config.xshare or c.config.ksum)
                      for c in (base.lookup(key, m), t39.lookup(key, m)))}
    # stop 49 chose per-shape PDL trigger points on the 3.6 engine's decode step (step_search.py --triggers)
    flagged |= {(key, m) for key, m in changed if (base.lookup(key, m).config or TileConfig()).trigger >= 0}
    # stop 44 re-chose some 3.6 picks on whole steps (step_search.py, linears and --engine), 3.9's not
    searched = {("w4a16:g128:6144x4096", 4), ("w4a16:g128:28672x4096", 4), ("w4a16:g128:4096x14336", 4),
                ("w4a8:g128:4096x14336", 16), ("w4a8:g128:4096x4096", 1)}
    assert {(key, m) for key, m in changed - flagged} <= {(key, m) for key in t39.entries for m in (1, 2)
                                                          if key.startswith("w4a16:")} | searched


def test_gpu_slow_path_is_announced_once_per_mode_and_format(monkeypatch):
    """Where no fused kernel serves a quantized store (W4A8 on group-16 int4), the GPU path
    dequantizes it per call (dequantize + cuBLAS, the same function as the reference) and warns once per mode
    and format, with what to do; dense stores never warn (the reference is F.linear there)."""
    import warnings

    from gearshift.dispatch import dispatcher as dsp
    from gearshift.quant import DenseWeight

    monkeypatch.setattr(dsp, "_WARNED_FALLBACKS", set())
    d = AdaptiveDispatcher(None, autoload=False)
    g16 = quantize_int4(torch.randn(256, 1024), 16)
    w4a8 = ActQuantSpec("int8")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert all(d.kernel_for(g16, w4a8, m)[1].strategy == "dequant_cublas" for m in (4, 16, 64, 512))
        assert d.kernel_for(quantize_int4(torch.randn(512, 1024), 16), w4a8, 4)[1].strategy == "dequant_cublas"
        assert d.kernel_for(quantize_int4(torch.randn(256, 1024), 32), w4a8, 4)[1].strategy == "w4a8_mma"
        assert d.kernel_for(DenseWeight(torch.randn(256, 1024)), w4a8, 4) is None
        strat, choice = d.kernel_for(quantize_int4(torch.randn(256, 1024), 128), w4a8, 4)
    assert choice.strategy == strat.name
    msgs = [str(w.message) for w in seen if issubclass(w.category, dsp.ReferenceFallbackWarning)]
    assert len(msgs) == 1 and "group 16" in msgs[0] and "dequantize + cuBLAS" in msgs[0]
    assert "--quantize int4" in msgs[0]


def test_policy_maps_save_and_load_gzipped(tmp_path):
    """A map saved under a `.gz` name is gzipped and loads back the same; a path to `NAME.json` finds
    `NAME.json.gz` where only that is left (results compressed after commands named them); a damaged
    gzip file is reported as not a map."""
    import gzip

    pm, key = _toy_map()
    p = pm.save(tmp_path / "p.json.gz")
    assert json.loads(gzip.decompress(p.read_bytes()))["device"] == "Toy GPU"
    assert PolicyMap.load(p).to_json() == pm.to_json()
    assert PolicyMap.load(tmp_path / "p.json").lookup(key, 16).config == TileConfig(16, 64, 256, 4)
    (tmp_path / "bad.json.gz").write_bytes(gzip.compress(b'{"version": 1')[:-6])
    with pytest.raises(ValueError, match="bad.json.gz is not a gearshift policy map"):
        PolicyMap.load(tmp_path / "bad.json.gz")
    with pytest.raises(OSError):
        PolicyMap.load(tmp_path / "missing.json")


@pytest.mark.parametrize("k", [576, 128])
def test_a_shape_the_rule_tile_cannot_run_gets_another_kernel_not_the_reference(k):
    """SmolLM2's K = 576 (and the tiny model's 128) is no multiple of W8A16's rule K-tile of 256: the rules
    then take a tile (or another kernel) of the mode that runs the shape, not the torch reference."""
    from gearshift.dispatch.dispatcher import default_choice

    d = AdaptiveDispatcher(None, autoload=False)
    st = quantize_int8(torch.randn(256, k))
    for act, mode in ((None, "w8a16"), (ActQuantSpec("int8"), "w8a8")):
        for m in (1, 3, 16, 64, 512):
            rule = default_choice(mode, m, 256)
            c = d.choose(st, act, m)
            s = STRATEGIES[c.strategy]
            assert mode in s.modes and c.strategy != "reference" and s.supports(st, act, c.config), (mode, m, c)
            if STRATEGIES[rule.strategy].supports(st, act, rule.config):
                assert c == rule  # where the rule's tile runs, it is still the one taken
            assert d.choose(st, act, m) == c


def test_w4a16_on_small_group_32_weights_runs_dequantize_cublas_above_16_tokens():
    """No map holds group-32 shapes; the rules' tl.dot tile took 1.9x dequantize + cuBLAS at 64 tokens on
    SmolLM2's (small) weights. Larger weights run the dequantize-first fragment kernel to 64 tokens, other
    groups keep the tile."""
    d = AdaptiveDispatcher(None, autoload=False)
    g32, g128 = quantize_int4(torch.randn(1536, 576), 32), quantize_int4(torch.randn(1536, 512), 128)
    assert all(d.choose(g32, None, m).strategy == "dequant_cublas" for m in (17, 64, 256, 4096))
    assert all(d.choose(g32, None, m).strategy != "dequant_cublas" for m in (1, 4, 16))
    assert d.choose(g128, None, 64).strategy == "w4a16_tc"
    big = quantize_int4(torch.randn(2048, 2048), 32)
    assert d.choose(big, None, 64).strategy == "w4a16_mma" and d.choose(big, None, 512).strategy == "dequant_cublas"
