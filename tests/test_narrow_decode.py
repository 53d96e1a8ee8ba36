"""Decode steps over the slots through the highest active one (`DecodePolicy.decode_width`): the same tokens
as full-width steps, in a server's loop where requests finish and join, narrower rows when few slots are busy,
and new requests taking the lowest free slot."""

import pytest

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.base import Sequence
from gearshift.decode.per_request_mode import PerRequestModePolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request
from gearshift.engine.warmup import warmup_runs
from gearshift.model.cuda_graphs import context_buckets

# (arrives after step, prompt, new tokens): finishing at different steps, and joining while others decode
ARRIVALS = [(0, [5, 6, 7], 9), (0, [8, 9], 3), (0, [10, 11, 12, 13], 5), (0, [14], 12), (2, [15, 16], 4),
            (4, [17, 18, 19], 6), (7, [20], 3), (7, [21, 22], 8)]


def _serve(loaded, policy, batch=8):
    """Run ARRIVALS through Engine.serve; returns each request's tokens and the row count of every forward."""
    rows = []
    forward = policy.model.forward

    def counting(tokens, *a, **k):
        rows.append(tokens.shape[0])
        return forward(tokens, *a, **k)

    policy.model.forward = counting
    try:
        steps, out = [0], {}

        def pull(idle):
            if len(taken) == len(ARRIVALS):
                return None
            if idle:  # nothing to decode: the next arrivals come now (the loop would end on an empty answer)
                steps[0] = max(steps[0], min(at for i, (at, _, _) in enumerate(ARRIVALS) if i not in taken))
            ready = [(i, Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)))
                     for i, (at, p, n) in enumerate(ARRIVALS) if at <= steps[0] and i not in taken]
            taken.update(i for i, _ in ready)
            steps[0] += 1
            return ready

        taken: set[int] = set()
        eng = Engine(loaded, max_batch=batch, max_seq_len=40)
        for ev in eng.serve(pull, policy, prefix_reuse=False):
            out.setdefault(ev.index, []).extend(ev.token_ids)
    finally:
        del policy.model.forward
    return out, rows


@pytest.mark.parametrize("pipelined", [False, True])
def test_narrow_steps_give_the_full_width_tokens(tiny_int4, pipelined):
    narrow = AutoregressivePolicy(tiny_int4.model, "w4a16", pipelined=pipelined)
    full = AutoregressivePolicy(tiny_int4.model, "w4a16", pipelined=pipelined)
    full.narrow_decode = False
    got, rows = _serve(tiny_int4, narrow)
    want, full_rows = _serve(tiny_int4, full)
    assert got == want and len(got) == len(ARRIVALS)
    assert all(len(got[i]) == n for i, (_, _, n) in enumerate(ARRIVALS))
    assert full_rows.count(8) >= 11  # every full-width step: the 12-token request alone takes 11 (prefills span
    # only their group's slots, 4 at most here)
    assert rows.count(8) < full_rows.count(8) and sum(rows) < sum(full_rows)  # with few requests left, narrower


def test_the_width_is_a_power_of_two_through_the_highest_slot(tiny_int4):
    p = AutoregressivePolicy(tiny_int4.model, "w4a16")
    p.bind(tiny_int4.model.new_cache(12, 16))
    seqs = lambda *slots: [Sequence(i, [1], SamplingParams(), slot=s) for i, s in enumerate(slots)]  # noqa: E731
    cases = [(0,), (1,), (0, 2), (3,), (4, 1), (8,), (11, 0)]
    assert [p.decode_width(seqs(*x)) for x in cases] == [1, 2, 4, 4, 8, 12, 12]
    assert p.decode_widths(12) == [1, 2, 4, 8, 12] and p.decode_widths(1) == [1]
    p.narrow_decode = False
    assert p.decode_width(seqs(0)) == 12 and p.decode_widths(12) == [12]
    both = PerRequestModePolicy(tiny_int4.model, ["w4a16", "w4a8"], "w4a16")
    assert both.decode_widths(4) == [1, 2, 4]


def test_new_requests_take_the_lowest_free_slot(tiny_int4):
    """Slot 2 of 4 frees up, then slot 0: the next request takes slot 0 (the list of free slots is in the
    order they were freed), so steps stay as narrow as the busy slots allow."""
    slots = {}
    eng = Engine(tiny_int4, max_batch=4, max_seq_len=40)
    policy = AutoregressivePolicy(tiny_int4.model, "w4a16")
    waves = {1: [(0, [3, 4], 4), (1, [5], 12), (2, [6, 7], 1), (3, [8], 12)], 7: [(4, [9], 2)]}
    state = {"pulls": 0}

    def pull(idle):
        state["pulls"] += 1
        wave = waves.pop(state["pulls"], [])
        if not wave and not waves and idle:
            return None
        return [(i, Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True))) for i, p, n in wave]

    prefill = policy.prefill

    def admitting(new, sample):
        slots.update({s.index: s.slot for s in new})
        return prefill(new, sample)

    policy.prefill = admitting
    list(eng.serve(pull, policy, prefix_reuse=False))
    assert [slots[i] for i in range(5)] == [0, 1, 2, 3, 0]


def test_the_warmup_runs_every_narrower_width():
    runs = warmup_runs(8, 40, [None], [1, 2, 4, 8])
    narrow = [(r.sequences, r.prompt_tokens) for r in runs if r.sequences in (2, 4)]
    assert narrow == [(2, 16), (2, 17), (2, 38), (4, 16), (4, 17), (4, 38)]
    assert warmup_runs(8, 40, [None]) == [r for r in runs if r[0] not in (2, 4)]
    # one decode graph per width and context bucket: a prompt one token under each bucket (or the longest)
    at_two = [r.prompt_tokens for r in warmup_runs(4, 600, [None], [1, 2, 4]) if r.sequences == 2]
    assert at_two == [16, 17, 127, 255, 511, 598]
    assert context_buckets(600) == [128, 256, 512, 600] and context_buckets(128) == [128]


def test_narrow_steps_on_the_fused_kernels(tiny_int4):
    """The fused path (Triton under the interpreter on CPU: KV write, decode attention) on a cache view of the
    first slots: the full-width tokens."""
    import os

    from gearshift.kernels._triton import HAS_TRITON
    from gearshift.kernels.switches import fused_on_cpu

    if not HAS_TRITON or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1, the CPU default in conftest)")
    fused_on_cpu(True)
    try:
        out = []
        for narrow in (True, False):
            p = AutoregressivePolicy(tiny_int4.model, "w4a16", pipelined=True)
            p.narrow_decode = narrow
            eng = Engine(tiny_int4, max_batch=4, max_seq_len=24)
            reqs = [Request([3, 4, 5], SamplingParams(max_new_tokens=n, ignore_eos=True)) for n in (6, 2)]
            out.append([r.token_ids for r in eng.generate(reqs, p)])
        assert out[0] == out[1] and [len(t) for t in out[0]] == [6, 2]
    finally:
        fused_on_cpu(False)


@pytest.mark.parametrize("chained,ahead", [(False, False), (True, False), (True, True)])
def test_narrow_qspec_cycles_give_the_full_width_tokens_and_ar_s(tiny_int4, chained, ahead):
    """QSPEC cycles on the first slots only: the full-width cycles' tokens, and (greedy) plain W4A16's; drafts
    queued ahead at another width are dropped, not fed to a cycle of this width."""
    from gearshift.decode.qspec import QSpecPolicy

    def qspec(narrow):
        p = QSpecPolicy(tiny_int4.model, "w4a8", "w4a16", gamma=3, chained_drafts=chained, cycle_ahead=ahead)
        p.narrow_decode = narrow
        return p

    got, rows = _serve(tiny_int4, qspec(True))
    want, full_rows = _serve(tiny_int4, qspec(False))
    ar, _ = _serve(tiny_int4, AutoregressivePolicy(tiny_int4.model, "w4a16"))
    assert got == want == ar
    assert rows.count(8) < full_rows.count(8) and sum(rows) < sum(full_rows)


def test_narrow_qspec_sampling_repeats_the_full_width_draws(tiny_int4):
    from gearshift.decode.qspec import QSpecPolicy

    out = []
    for narrow in (True, False):
        p = QSpecPolicy(tiny_int4.model, "w4a8", "w4a16", gamma=2)
        p.narrow_decode = narrow
        eng = Engine(tiny_int4, max_batch=4, max_seq_len=32)
        reqs = [Request([3, 4, 5], SamplingParams(max_new_tokens=n, temperature=0.9, seed=7 + n, ignore_eos=True))
                for n in (9, 3)]
        out.append([r.token_ids for r in eng.generate(reqs, p)])
    assert out[0] == out[1] and [len(t) for t in out[0]] == [9, 3]


@pytest.mark.parametrize("rule,pipelined", [("max", False), ("split", False), ("max", True)])
def test_narrow_gearbox_steps_give_the_full_width_tokens_and_telemetry(model_dir, rule, pipelined):
    """GEARBX on the first slots (the monitor pads the rows beyond them): the full-width steps' tokens,
    entropies and gears, with gear shifts (high -> low after the minimum duration), both batch rules,
    sequences joining and leaving, and a sampled row."""
    from gearshift.decode.gearbox import GearboxPolicy
    from gearshift.model.loader import load_model

    dense = load_model(model_dir("tiny"), progress=False)
    prompts = [[1, 5, 7, 9], [3, 4, 8, 100, 200], [17, 30, 31], [42], [6, 7]]
    out = {}
    for narrow in (True, False):
        pol = GearboxPolicy(dense.model, initial_gear="high", calibrate=False, min_gear_duration=3,
                            batch_rule=rule, pipelined=pipelined,
                            monitor_kwargs=dict(theta_low=30, theta_high=40, catastrophic_fraction=2.0))
        pol.narrow_decode = narrow
        reqs = [Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in zip(prompts, (8, 3, 6, 9, 2))]
        reqs.append(Request([5, 6, 7], SamplingParams(max_new_tokens=5, temperature=0.9, seed=11, ignore_eos=True)))
        eng = Engine(dense, max_batch=4)
        rows, forward = [], dense.model.forward
        dense.model.forward = lambda tokens, *a, **k: (rows.append(tokens.shape[0]), forward(tokens, *a, **k))[1]
        try:
            res = eng.generate(reqs, pol)
        finally:
            del dense.model.forward
        pol.close()
        out[narrow] = (res, eng.last_stats, rows)
    (narrow_res, st1, rows1), (full_res, st0, rows0) = out[True], out[False]
    assert rows1.count(4) < rows0.count(4) and sum(rows1) < sum(rows0)  # the narrow run's steps narrowed
    assert [r.token_ids for r in narrow_res] == [r.token_ids for r in full_res]
    for a, b in zip(narrow_res, full_res):
        for key in ("entropy", "gear", "wanted_gear"):
            assert a.stats["gearbox"][key] == b.stats["gearbox"][key], key
    assert st1["gear_counts"] == st0["gear_counts"] and st1["gear_counts"]["low"] > 0
