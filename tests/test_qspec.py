"""QSPEC (decode/qspec.py): greedy equivalence with verify-mode AR, the KV overwrite and its
ablation, budgets, stats, the CLI plug-in, and memory (one weight store, one KV cache).

The sampling-distribution test is in test_qspec_sampling.py.
"""

import gc
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.qspec import QSpecPolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [3], [40, 41, 42]]
NEW = 14
TIE_REL = 1e-5  # a top-2 logit gap below this (relative to |top-1 logit|) is a floating-point tie


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tiny_int4):
    return tiny_int4


def generate(lm, policy, params, prompts=PROMPTS, batch=8):
    eng = Engine(lm, max_batch=batch)
    res = eng.generate([Request(p, params()) for p in prompts], policy)
    return [r.token_ids for r in res], eng


@pytest.fixture(scope="module")
def ar_greedy(lm):
    toks, _ = generate(lm, AutoregressivePolicy(lm.model, "w4a16"), lambda: SamplingParams(max_new_tokens=NEW,
                                                                                               ignore_eos=True))
    return toks


def verify_logits(lm, context, mode="w4a16"):
    cache = lm.model.new_cache(1, len(context) + 1)
    return lm.model(torch.tensor([context]), cache, [0], [len(context)], mode=mode, logits="last")[0, 0]


def assert_same_or_tie(lm, prompt, ref, got, what):
    """ref == got, or they first differ where the verify mode's top-2 logits tie (then skip, reporting it)."""
    if ref == got:
        return
    j = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    assert j < min(len(ref), len(got)), f"{what}: lengths differ ({len(ref)} vs {len(got)}) with equal prefixes"
    logits = verify_logits(lm, prompt + ref[:j])
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    rel = gap / max(abs(float(top.values[0])), 1e-30)
    if rel < TIE_REL and {ref[j], got[j]} <= set(top.indices.tolist()):
        pytest.skip(f"{what}: floating-point tie at generated position {j} (prompt {prompt}): tokens "
                    f"{ref[j]} vs {got[j]}, top-2 logit gap {gap:.3g} ({rel:.3g} relative)")
    raise AssertionError(f"{what}: QSPEC differs from verify-mode AR at generated position {j} (prompt {prompt}): "
                         f"AR {ref[j]}, QSPEC {got[j]}; top-2 logit gap {gap:.3g} ({rel:.3g} relative) is no tie\n"
                         f"AR    {ref}\nQSPEC {got}")


@pytest.mark.parametrize("draft", ["w4a4", "w4a8"])
@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 5, 6])
def test_greedy_equals_verify_mode_ar(lm, ar_greedy, draft, gamma):
    pol = QSpecPolicy(lm.model, draft, "w4a16", gamma)
    got, eng = generate(lm, pol, lambda: SamplingParams(max_new_tokens=NEW, ignore_eos=True), batch=4)
    for p, ref, g in zip(PROMPTS, ar_greedy, got):
        assert_same_or_tie(lm, p, ref, g, f"draft {draft} gamma {gamma}")
    st = eng.last_stats
    assert st["policy"] == "qspec" and st["drafted"] > 0 and 0 <= st["acceptance_rate"] <= 1
    assert st["verify_forwards"] == st["cycles"] and st["draft_s"] > 0 and st["verify_s"] > 0
    assert 1 <= st["mean_accepted_length"] <= gamma + 1


def test_rejections_are_exercised(lm):
    """The tiny random model's w4a4 draft disagrees with w4a16 often enough to test rejection paths."""
    _, eng = generate(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", 4),
                      lambda: SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    assert 0 < eng.last_stats["acceptance_rate"] < 1


class RecordingQSpec(QSpecPolicy):
    """Remembers, per cycle, the drafted tokens of each slot (to see where a stop token sat)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.cycles = []

    def _accept(self, logits, seqs, drafts, qprobs):
        res = super()._accept(logits, seqs, drafts, qprobs)
        self.cycles.append({s.slot: (list(drafts[s.slot]), r) for s, r in zip(seqs, res)})
        return res


@pytest.mark.parametrize("draft", ["w4a4", "w4a8"])
def test_stop_token_inside_a_draft(lm, ar_greedy, draft):
    # a token AR emits early in a prompt becomes the stop token for every prompt; candidates are tried in
    # turn until one is drafted and accepted inside a cycle (which one is depends on the random model)
    inside = 0
    for row, pos in ((3, 1), (3, 2), (0, 1), (1, 1), (2, 1)):
        stop = ar_greedy[row][pos]
        if stop in ar_greedy[row][:pos]:
            continue
        params = lambda: SamplingParams(max_new_tokens=NEW, stop_token_ids=[stop])  # noqa: E731
        ref, _ = generate(lm, AutoregressivePolicy(lm.model, "w4a16"), params)
        assert ref[row] == ar_greedy[row][:pos + 1]
        for gamma in (2, 3, 4, 6):
            pol = RecordingQSpec(lm.model, draft, "w4a16", gamma)
            got, _ = generate(lm, pol, params, batch=3)
            for p, r, g in zip(PROMPTS, ref, got):
                assert_same_or_tie(lm, p, r, g, f"stop token {stop}, draft {draft} gamma {gamma}")
            # was the stop drafted and accepted before the last draft position (tokens after it trimmed)?
            for cyc in pol.cycles:
                for d, (n, _) in cyc.values():
                    if stop in d[:n]:
                        inside += 1
                        # drafting stops right after a drafted stop token
                        assert d.index(stop) == len(d) - 1
        if inside:
            break
    assert inside > 0, "no cycle accepted a drafted stop token for any candidate stop"


@pytest.mark.parametrize("chained", [False, True], ids=["host", "device"])
def test_mixed_params_in_one_batch(lm, ar_greedy, chained):
    """Greedy rows stay AR-exact next to sampled rows; sampled rows are seeded and reproducible, drawn and
    accepted on the host (the step-by-step cycle) or on the device (the chained one)."""
    reqs = lambda: [Request(p, SamplingParams(max_new_tokens=NEW, ignore_eos=True) if i % 2 == 0 else  # noqa: E731
                            SamplingParams(temperature=0.8, top_k=20, top_p=0.95, seed=i, max_new_tokens=NEW,
                                           ignore_eos=True))
                    for i, p in enumerate(PROMPTS)]
    outs = []
    for _ in range(2):
        eng = Engine(lm, max_batch=5)
        pol = QSpecPolicy(lm.model, "w4a4", "w4a16", 3, chained_drafts=chained)
        outs.append([r.token_ids for r in eng.generate(reqs(), pol)])
    assert outs[0] == outs[1]
    for i, (p, ref) in enumerate(zip(PROMPTS, ar_greedy)):
        assert len(outs[0][i]) == NEW
        if i % 2 == 0:
            assert_same_or_tie(lm, p, ref, outs[0][i], "greedy row in a mixed batch")


@pytest.mark.parametrize("new", [1, 2, 3, 7])
def test_budget_and_cache_room(lm, ar_greedy, new):
    """Near max_new_tokens the policy drafts less; the cache (capacity + lookahead) never overflows."""
    pol = QSpecPolicy(lm.model, "w4a4", "w4a16", 6)
    assert pol.lookahead == 6
    over = []
    orig = pol.step

    def checked(seqs, sample):  # no cycle produces tokens past max_new_tokens (nothing for the engine to trim)
        orig(seqs, sample)
        over.extend((s.index, len(s.output)) for s in seqs if len(s.output) > s.params.max_new_tokens)

    pol.step = checked
    got, eng = generate(lm, pol, lambda: SamplingParams(max_new_tokens=new, ignore_eos=True))
    assert not over
    for p, ref, g in zip(PROMPTS, ar_greedy, got):
        assert len(g) == new
        assert_same_or_tie(lm, p, ref[:new], g, f"max_new_tokens {new}")
    if new == 1:
        assert eng.last_stats["drafted"] == 0  # one token left: a plain verify-mode step


def test_continuous_batching_refills(lm, ar_greedy):
    got, _ = generate(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", 3),
                      lambda: SamplingParams(max_new_tokens=NEW, ignore_eos=True), batch=2)
    for p, ref, g in zip(PROMPTS, ar_greedy, got):
        assert_same_or_tie(lm, p, ref, g, "batch 2 with refills")


def test_stats_and_per_request_stats(lm):
    _, eng = generate(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", 3),
                      lambda: SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    st = eng.last_stats
    for k in ("acceptance_rate", "mean_accepted_length", "drafted", "accepted", "draft_s", "verify_s",
              "prefill_s", "draft_s_per_token", "verify_s_per_token", "cycles", "draft_forwards"):
        assert k in st, k
    assert st["acceptance_rate"] == round(st["accepted"] / st["drafted"], 4)
    assert st["emitted"] == st["accepted"] + st["seq_cycles"]
    assert st["draft_forwards"] <= 3 * st["cycles"]
    per = [s.stats for s in eng.sequences]
    assert sum(x["drafted"] for x in per) == st["drafted"] and sum(x["accepted"] for x in per) == st["accepted"]
    assert all(1 <= x["mean_accepted_length"] <= 4 for x in per)


def test_rejects_bad_arguments(lm):
    from gearshift.errors import GearshiftError

    with pytest.raises(GearshiftError):
        QSpecPolicy(lm.model, gamma=0)
    with pytest.raises(GearshiftError):
        QSpecPolicy(lm.model, draft_mode="w8a8")  # 8-bit weights: not the same store
    with pytest.raises(GearshiftError):
        QSpecPolicy(lm.model, acceptance="typical")


# ---- the KV overwrite and its ablation ------------------------------------------------------------

def one_cycle(lm, overwrite, prompt=PROMPTS[2], gamma=4):
    """Prefill + one QSPEC cycle on batch 1; returns the policy, its cache and the sequence."""
    from gearshift.decode.base import Sequence

    pol = QSpecPolicy(lm.model, "w4a4", "w4a16", gamma, kv_overwrite=overwrite)
    cache = lm.model.new_cache(1, 64)
    pol.bind(cache)
    s = Sequence(0, list(prompt), SamplingParams(max_new_tokens=20, ignore_eos=True), slot=0)
    pol.prefill([s], None)
    drafts = []
    orig = pol._pick_drafts

    def spy(logits, seqs, qprobs):
        out = orig(logits, seqs, qprobs)
        drafts.extend(out)
        return out

    pol._pick_drafts = spy
    pol.step([s], None)
    return pol, cache, s, drafts


def kv_of(lm, prompt, fed, mode_per_token):
    """K/V of positions len(prompt)-1.. when `fed` tokens run one at a time (T=1) in the given modes."""
    cache = lm.model.new_cache(1, 64)
    lm.model(torch.tensor([prompt[:-1]]), cache, [0], [len(prompt) - 1], mode="w4a16")
    for i, (tok, mode) in enumerate(zip(fed, mode_per_token)):
        lm.model(torch.tensor([[tok]]), cache, [len(prompt) - 1 + i], [1], mode=mode)
    lo = len(prompt) - 1
    return cache.k[:, 0, :, lo:lo + len(fed)].clone(), cache.v[:, 0, :, lo:lo + len(fed)].clone()


def test_kv_overwrite_writes_verify_kv(lm):
    prompt = PROMPTS[2]
    pol, cache, s, drafts = one_cycle(lm, True, prompt)
    n = len(s.output) - 1  # accepted drafts
    assert cache.lengths[0] == len(prompt) + n  # all but the new last token
    lo = len(prompt) - 1
    fed = [prompt[-1]] + drafts  # the verify's window, run in one forward
    ref = lm.model.new_cache(1, 64)
    lm.model(torch.tensor([prompt[:-1]]), ref, [0], [lo], mode="w4a16")
    lm.model(torch.tensor([fed]), ref, [lo], [len(fed)], mode="w4a16")
    keep = n + 1
    assert torch.equal(cache.k[:, 0, :, lo:lo + keep], ref.k[:, 0, :, lo:lo + keep])
    assert torch.equal(cache.v[:, 0, :, lo:lo + keep], ref.v[:, 0, :, lo:lo + keep])
    dk, _ = kv_of(lm, prompt, fed[:keep], ["w4a4"] * keep)
    assert not torch.equal(cache.k[:, 0, :, lo:lo + keep], dk)  # the draft K/V are gone


def test_no_kv_overwrite_keeps_draft_kv(lm):
    prompt = PROMPTS[2]
    pol, cache, s, drafts = one_cycle(lm, False, prompt)
    n = len(s.output) - 1
    lo = len(prompt) - 1
    assert cache.lengths[0] == lo + n + 1
    # accepted positions that a draft forward fed (all but a fully accepted draft's last token,
    # which only the verify pass ever saw) hold the draft mode's K/V
    fed = ([prompt[-1]] + drafts)[: min(n + 1, len(drafts))]
    dk, dv = kv_of(lm, prompt, fed, ["w4a4"] * len(fed))
    assert torch.equal(cache.k[:, 0, :, lo:lo + len(fed)], dk)
    assert torch.equal(cache.v[:, 0, :, lo:lo + len(fed)], dv)
    assert pol.stats()["kv_overwrite"] is False


def test_no_kv_overwrite_generates(lm):
    got, eng = generate(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", 3, kv_overwrite=False),
                        lambda: SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    assert all(len(g) == NEW for g in got) and eng.last_stats["drafted"] > 0


# ---- memory: one weight store, one KV cache ---------------------------------------------------------

class RecordingDispatcher:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def linear(self, x, store, act, bias=None, codes=None):
        self.calls.append((None if act is None else getattr(act, "dtype", getattr(act, "kind", "?")),
                           id(store), tuple(b.data_ptr() for b in store.buffers())))
        return self.inner.linear(x, store, act, bias, codes)


def model_storages(model):
    return {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}


def test_draft_and_verify_read_the_same_weight_store(lm):
    from gearshift.dispatch import dispatcher as dmod

    before = model_storages(lm.model)
    n_before = sum(1 for _ in lm.model.parameters()) + sum(1 for _ in lm.model.buffers())
    rec = RecordingDispatcher(dmod.get_dispatcher())
    dmod.set_dispatcher(rec)
    try:
        pol = QSpecPolicy(lm.model, "w4a4", "w4a16", 3)
        generate(lm, pol, lambda: SamplingParams(max_new_tokens=6, ignore_eos=True))
    finally:
        dmod.set_dispatcher(rec.inner)
    by_act: dict = {}
    for act, sid, ptrs in rec.calls:
        by_act.setdefault(act, set()).add((sid, ptrs))
    assert set(by_act) >= {None, "int4"}  # w4a16 (A16: no quantizer) and w4a4 (int4 activations)
    stores = {(id(lin.store), tuple(b.data_ptr() for b in lin.store.buffers()))
              for name, lin in lm.model.linear_layers() if name != "lm_head"}
    assert by_act["int4"] == stores
    assert by_act[None] >= stores  # + the pinned w16a16 lm_head
    assert model_storages(lm.model) == before
    assert sum(1 for _ in lm.model.parameters()) + sum(1 for _ in lm.model.buffers()) == n_before


class AllocationLog(TorchDispatchMode):
    """Records the bytes of every new storage an aten op returns (views and in-place results are skipped)."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_leaves

        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:  # new storage
                self.sizes.append((t.untyped_storage().nbytes(), str(func)))
        return out


@pytest.mark.parametrize("overwrite", [True, False])
def test_no_second_kv_cache(lm, overwrite):
    """Over prefill and several cycles the policy allocates nothing of KV size (tensor-counting)."""
    from gearshift.decode.base import Sequence
    from gearshift.model.kv_cache import KVCache

    pol = QSpecPolicy(lm.model, "w4a4", "w4a16", 4, kv_overwrite=overwrite)
    cache = lm.model.new_cache(4, 1024)
    kv_bytes = cache.k.untyped_storage().nbytes()
    layer_bytes = kv_bytes // cache.k.shape[0]
    pol.bind(cache)
    seqs = [Sequence(i, list(p), SamplingParams(max_new_tokens=30, ignore_eos=True), slot=i)
            for i, p in enumerate(PROMPTS[:4])]
    log = AllocationLog()
    with log:
        pol.prefill(seqs, None)
        for _ in range(4):
            pol.step(seqs, None)
    assert pol.cache is cache and all(len(s.output) >= 4 for s in seqs)
    largest, op = max(log.sizes)
    # nothing close to even one layer's slice of the cache (the no-overwrite backup holds <= gamma positions)
    assert largest < layer_bytes // 8, (largest, op, layer_bytes)
    others = [o for o in gc.get_objects() if isinstance(o, KVCache) and o is not cache]
    assert all(o.k.untyped_storage().data_ptr() != cache.k.untyped_storage().data_ptr() for o in others)
    kv_shaped = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.shape == cache.k.shape]
    assert {t.data_ptr() for t in kv_shaped} == {cache.k.data_ptr(), cache.v.data_ptr()}


# ---- the CLI plug-in ------------------------------------------------------------------------------

def test_cli_generate_qspec_json(model_dir, capsys):
    from gearshift.cli import main

    path = model_dir("tiny")
    rc = main(["generate", "--model", str(path), "--prompt", "hello world", "--prompt", "the quick brown fox",
               "--no-chat", "--policy", "qspec", "--gamma", "4", "--draft-mode", "w4a8", "--max-new-tokens", "8",
               "--ignore-eos", "--group-size", "32", "--json"])
    assert rc in (0, None)
    out = json.loads(capsys.readouterr().out)
    st = out["stats"]
    assert st["policy"] == "qspec" and st["gamma"] == 4 and st["draft_mode"] == "w4a8"
    for k in ("acceptance_rate", "mean_accepted_length", "drafted", "accepted", "draft_s", "verify_s"):
        assert k in st
    assert all(len(o["token_ids"]) == 8 and "drafted" in o["stats"] for o in out["outputs"])
    rc = main(["generate", "--model", str(path), "--prompt", "hello world", "--no-chat", "--policy", "qspec",
               "--no-kv-overwrite", "--acceptance", "greedy", "--temperature", "0.7", "--max-new-tokens", "5",
               "--ignore-eos", "--group-size", "32", "--json"])
    st = json.loads(capsys.readouterr().out)["stats"]
    assert st["kv_overwrite"] is False and st["acceptance"] == "greedy"


def test_modeled_speedup_from_a_policy_map():
    """DESIGN.md's formula on the map's kernel times: a draft step as costly as the verify step
    cannot pay; a draft step 4x cheaper can."""
    from gearshift.decode.qspec import modeled_speedup, tokens_per_cycle
    from gearshift.dispatch.policy import Choice, PolicyMap, type_key
    from gearshift.dispatch.strategies import group_of, mode_key
    from gearshift.model.tiny import build_random_model
    from gearshift.quant.modes import get_mode

    model = build_random_model("tiny", weights="int4", group_size=32, device="cpu", dtype=torch.float32)
    lins = [(n, lin) for n, lin in model.linear_layers() if n != "lm_head"]

    def make_map(draft_us: float) -> PolicyMap:
        pm = PolicyMap("Toy GPU")
        for _, lin in lins:
            st = lin.store
            for mode, us_of_m in (("w4a16", lambda m: 10.0 + m), ("w4a4", lambda m: draft_us)):
                key = type_key(mode_key(st, get_mode(mode).act), group_of(st), st.out_features, st.in_features)
                for m in pm.buckets:
                    pm.set(key, m, Choice("w4a16_tc", None, us_of_m(m)))
        return pm

    n = len(lins)
    slow = modeled_speedup(make_map(11.0), model, "w4a4", "w4a16", 3, 1, 0.9)
    assert abs(slow["t_ar_ms"] - n * 11.0 / 1e3) < 1e-9 and abs(slow["t_verify_ms"] - n * 14.0 / 1e3) < 1e-9
    expect = tokens_per_cycle(0.9, 3) * 11.0 / (3 * 11.0 + 14.0)
    assert abs(slow["speedup"] - expect) < 1e-9 and slow["speedup"] < 1
    fast = modeled_speedup(make_map(2.75), model, "w4a4", "w4a16", 3, 1, 0.9)
    assert fast["speedup"] > 1
    assert modeled_speedup(PolicyMap("Toy GPU"), model, "w4a4", "w4a16", 3, 1, 0.9) is None  # shapes unknown


@pytest.mark.parametrize("new,batch", [(NEW, 4), (3, 8), (NEW, 2)])
def test_chained_drafts_are_the_step_by_step_drafts(lm, ar_greedy, new, batch):
    """Greedy cycles on the device (drafts chained, the verify fed by them, one read back; on by
    default on CUDA, forced here on the CPU) make the step-by-step loop's drafts and accept the same:
    same tokens, same drafted / accepted counts, with budgets cut by max_new_tokens and slots refilled."""
    params = lambda: SamplingParams(max_new_tokens=new, ignore_eos=True)  # noqa: E731
    runs = []
    for chained in (False, True):
        got, eng = generate(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", 3, chained_drafts=chained), params,
                            batch=batch)
        runs.append((got, {k: eng.last_stats[k] for k in ("drafted", "accepted", "cycles", "emitted")}))
    assert runs[0] == runs[1]
    for p, ref, g in zip(PROMPTS, ar_greedy, runs[1][0]):
        assert_same_or_tie(lm, p, ref[:new], g, f"chained drafts, max_new_tokens {new}, batch {batch}")


def test_chained_drafts_cut_at_a_stop_token(lm, ar_greedy):
    """A row keeps drafting on the device after drafting a stop token; those drafts are dropped, so
    the output is the step-by-step loop's and drafting ends at the stop."""
    class Kept(QSpecPolicy):  # records the drafts kept per row and cycle
        def _keep_drafts(self, table, drafting, budget, drafts):
            super()._keep_drafts(table, drafting, budget, drafts)
            self.kept = getattr(self, "kept", []) + [(list(drafts[s.slot]), table[s.slot][:budget[s.slot]])
                                                     for s in drafting]

    past_a_stop = 0  # rows that drafted past a stop token on the device
    for row, pos in ((3, 1), (0, 1), (1, 1), (2, 1), (3, 2), (0, 2)):
        stop = ar_greedy[row][pos]
        params = lambda: SamplingParams(max_new_tokens=NEW, stop_token_ids=[stop])  # noqa: E731
        ref, _ = generate(lm, AutoregressivePolicy(lm.model, "w4a16"), params)
        for kv_overwrite in (True, False):  # one read back per cycle, and drafts read before the verify
            pol = Kept(lm.model, "w4a4", "w4a16", 4, kv_overwrite=kv_overwrite, chained_drafts=True)
            got, _ = generate(lm, pol, params, batch=3)
            if kv_overwrite:
                for p, r, g in zip(PROMPTS, ref, got):
                    assert_same_or_tie(lm, p, r, g, f"chained drafts, stop token {stop}")
            else:  # (the ablation keeps draft K/V, so it is not AR's: it must be the step-by-step loop's)
                plain, _ = generate(lm, QSpecPolicy(lm.model, "w4a4", "w4a16", 4, kv_overwrite=False,
                                                    chained_drafts=False), params, batch=3)
                assert got == plain
            assert all(stop not in kept[:-1] for kept, _ in pol.kept)
            past_a_stop += sum(stop in made[:-1] and kept[-1] == stop for kept, made in pol.kept)
        if past_a_stop:
            break
    assert past_a_stop > 0, "no candidate stop token was drafted before a row's last draft position"


@pytest.mark.parametrize("new,batch,stop", [(NEW, 8, False), (NEW, 2, False), (3, 8, False), (NEW, 3, True)])
def test_drafts_queued_a_cycle_ahead_change_nothing(lm, ar_greedy, new, batch, stop):
    """cycle_ahead (on by default on CUDA, forced here on the CPU): each cycle's drafts are queued behind
    the verify before it, at the lengths the device accepted. Same tokens and same draft / accept
    counts as the chained cycle without it; used where the next cycle is the one assumed, dropped where
    a sequence finished or joined (batch 2 / 3 refill slots) or a stop token cut the drafts."""
    stop_ids = [ar_greedy[0][4], ar_greedy[2][2]] if stop else None
    params = lambda: SamplingParams(max_new_tokens=new, ignore_eos=not stop, stop_token_ids=stop_ids)  # noqa: E731
    runs, stats = [], []
    for ahead in (False, True):
        got, eng = generate(lm, QSpecPolicy(lm.model, "w4a8", "w4a16", 3, chained_drafts=True, cycle_ahead=ahead),
                            params, batch=batch)
        runs.append((got, {k: eng.last_stats[k] for k in ("drafted", "accepted", "cycles", "emitted")}))
        stats.append(eng.last_stats)
    assert runs[0] == runs[1]
    assert stats[0]["cycles_ahead"] == 0 and "discarded_forwards" not in stats[1]  # (AR's counter, not QSPEC's)
    assert stats[1]["cycles_ahead"] > 0 or new <= 4  # (3 new tokens: one cycle a sequence, nothing to queue for)
    if batch < len(PROMPTS) or stop:  # a finished sequence's slot is refilled: the drafts queued for it are dropped
        assert stats[1]["discarded_draft_forwards"] > 0
    if not stop:
        for p, ref, g in zip(PROMPTS, ar_greedy, runs[1][0]):
            assert_same_or_tie(lm, p, ref[:new], g, f"drafts a cycle ahead, max_new_tokens {new}, batch {batch}")
