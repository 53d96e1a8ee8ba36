"""CUDA-graph replay keys (model/cuda_graphs.py): a graph is replayed only under the setting it was
captured with. The switches' part is in test_decode_attention.py; here, the dispatcher's."""

import pytest
import torch

GPU = torch.cuda.is_available()


@pytest.mark.skipif(not GPU, reason="CUDA graphs")
def test_graphs_are_keyed_by_the_dispatcher():
    """Installing another dispatcher (another policy map) between steps must not replay graphs
    whose kernels the previous one chose."""
    from gearshift.dispatch import AdaptiveDispatcher, get_dispatcher, set_dispatcher
    from gearshift.model.tiny import build_random_model

    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (2, 4), device="cuda")

    installed = get_dispatcher()
    model.use_cuda_graphs = True
    try:
        cache = model.new_cache(2, 16)
        model(ids, cache, [0] * 2, [4] * 2, mode="w4a16")

        def step():  # the same decode step again (it rewrites the same cache entries)
            return model(ids[:, -1:], cache, [4] * 2, [1] * 2, mode="w4a16")

        first = step()
        n = model._graphs.captures
        assert step().equal(first) and model._graphs.captures == n  # same dispatcher: replayed
        set_dispatcher(AdaptiveDispatcher())
        assert step().equal(first)  # (the same map: the same kernels and bits)
        assert model._graphs.captures == n + 1  # but a new dispatcher: captured anew
    finally:
        set_dispatcher(installed)
        model.use_cuda_graphs = False


def test_token_buckets():
    """Steps of up to 16 tokens keep their length; longer ones pad to 2^k or 1.5 * 2^k, never to
    more than 1.5x their tokens, and a bucket maps to itself."""
    from gearshift.model.cuda_graphs import token_bucket

    assert [token_bucket(t) for t in (1, 7, 16)] == [1, 7, 16]
    assert [token_bucket(t) for t in (17, 25, 33, 49, 65, 97, 129, 257, 513, 769)] == \
        [24, 32, 48, 64, 96, 128, 192, 384, 768, 1024]
    for t in range(17, 3000):
        b = token_bucket(t)
        assert t <= b < 1.5 * t and token_bucket(b) == b


@pytest.mark.skipif(not GPU, reason="CUDA graphs")
def test_long_steps_run_eagerly_once_then_from_a_graph():
    """A prefill longer than graph_max_tokens runs padded to its token bucket: eagerly at first
    sight, captured at the second, replayed from the third, with the same logits each time; and
    close to the unpadded eager forward (other tiles may serve the padded row count). Steps asking
    for every position's logits, or over graph_max_rows rows, stay eager."""
    from gearshift.model.tiny import build_random_model

    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 512, (2, 20), device="cuda")  # bucket 24

    def prefill(logits):
        cache = model.new_cache(2, 64)
        return model(ids, cache, [0, 0], [20, 17], mode="w4a16", logits=logits)

    plain = prefill("all")
    model.use_cuda_graphs = True
    try:
        runs = [prefill("last") for _ in range(3)]
        captures = model._graphs.captures
        assert captures == 1  # first sight eager, second captured, third replayed
        assert runs[0].equal(runs[1]) and runs[1].equal(runs[2])
        # every position's logits: long steps stay eager at their exact length (a graph would keep
        # [B, T, V] fp32 logits alive), so no capture however often
        assert prefill("all").equal(plain) and prefill("all").equal(plain) and model._graphs.captures == captures
        last = torch.stack([plain[0, 19], plain[1, 16]])
        torch.testing.assert_close(last, runs[0][:, 0], atol=2e-2, rtol=2e-2)
        model.graph_max_rows = 32  # 2 x 24 rows over the limit: eager at the exact length, no capture
        over = [prefill("last") for _ in range(2)]
        assert over[0].equal(over[1]) and model._graphs.captures == captures
        torch.testing.assert_close(over[0], runs[0], atol=2e-2, rtol=2e-2)
    finally:
        model.use_cuda_graphs = False
        model.graph_max_rows = type(model).graph_max_rows


@pytest.mark.skipif(not GPU, reason="CUDA graphs")
@pytest.mark.parametrize("t", [5, 20])  # captured at first sight; padded to bucket 24, captured at the second
def test_relocatable_prefills_share_one_graph_whatever_their_slot(t):
    """A one-row prefill on a slot of a running batch (`relocatable`, as a joining sequence's) runs in the
    staging cache: prefills landing in slots 1, 3, 2 (with 6 positions already cached) and 1 again replay one
    graph, and give the logits and cache entries of graphs captured on the slots themselves bit for bit,
    with the other slots untouched."""
    from gearshift.model.tiny import build_random_model

    torch.manual_seed(0)
    model = build_random_model("tiny", weights="int4", device="cuda", dtype=torch.bfloat16)
    cap = 40
    first = model.new_cache(4, cap)
    model(torch.randint(0, 512, (4, 6), device="cuda"), first, [0] * 4, [6] * 4, mode="w4a16", logits="last")

    def run(relocatable):
        cache = model.new_cache(4, cap)
        cache.k.copy_(first.k), cache.v.copy_(first.v)
        cache.lengths = list(first.lengths)
        before, outs = model._graph_runner().captures, []
        for slot, start in ((1, 0), (3, 0), (2, 6), (1, 0)):
            ids = torch.randint(0, 512, (1, t), device="cuda", generator=torch.Generator("cuda").manual_seed(slot))
            outs.append(model(ids, cache.slots(slot, 1), [start], [t], mode="w4a16", logits="last",
                              relocatable=relocatable))
        return outs, cache, model._graph_runner().captures - before

    model.use_cuda_graphs = True
    try:
        want, want_cache, per_slot = run(False)
        got, cache, shared = run(True)
        assert (per_slot, shared) == ((3, 1) if t <= model.graph_max_tokens else (1, 1))
        assert all(a.equal(b) for a, b in zip(want, got))
        assert cache.k[..., :cap, :].equal(want_cache.k[..., :cap, :])  # (position cap is the padding's scratch)
        assert cache.v[..., :cap, :].equal(want_cache.v[..., :cap, :])
        assert cache.k[:, 0].equal(first.k[:, 0])  # slot 0 was never written
    finally:
        model.use_cuda_graphs = False


def _refill_workload(weights: str):
    """A tiny random CUDA model with graphs on, and five requests for a batch of 3 (slots refilled mid-way)."""
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import LoadedModel
    from gearshift.model.tiny import build_random_model, preset_config

    torch.manual_seed(0)
    model = build_random_model("tiny", weights=weights, device="cuda", dtype=torch.bfloat16)
    loaded = LoadedModel(model, None, ModelConfig.from_hf_dict(preset_config("tiny")), "tiny")
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 9, 3, 20, 7)]
    model.use_cuda_graphs = True
    return model, loaded, prompts, (12, 5, 20, 9, 14)


@pytest.mark.skipif(not GPU, reason="CUDA graphs")
def test_run_ahead_decode_on_graphs_gives_the_same_tokens():
    """AR's one-step-ahead loop on replayed graphs (the launch of step n + 1 reuses the graph's input
    buffers while step n may still run): the same greedy tokens as the plain loop, with slots refilled
    mid-way."""
    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request

    model, loaded, prompts, lengths = _refill_workload("int4")
    try:
        outs = []
        for pipelined in (False, True):
            eng = Engine(loaded, max_batch=3)
            res = eng.generate([Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True))
                                for p, n in zip(prompts, lengths)], AutoregressivePolicy(model, "w4a16", pipelined))
            outs.append([r.token_ids for r in res])
        assert outs[0] == outs[1] and [len(t) for t in outs[1]] == list(lengths)
    finally:
        model.use_cuda_graphs = False


@pytest.mark.skipif(not GPU, reason="CUDA graphs")
def test_qspec_drafts_a_cycle_ahead_on_graphs_give_the_same_cycles():
    """QSPEC's next drafts queued behind the verify on replayed graphs, at device-computed positions
    (`Transformer.forward_at`): the same tokens, drafts and acceptances as the cycle that launches
    them after the read back, with slots refilled mid-way; and they are used."""
    from gearshift.decode.qspec import QSpecPolicy
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request

    model, loaded, prompts, lengths = _refill_workload("int4-prog")
    try:
        outs = []
        for ahead in (False, True):
            eng = Engine(loaded, max_batch=3)
            pol = QSpecPolicy(model, "w4a8", "w4a16", 3, cycle_ahead=ahead)
            res = eng.generate([Request(p, SamplingParams(max_new_tokens=n, ignore_eos=True))
                                for p, n in zip(prompts, lengths)], pol)
            st = eng.last_stats
            outs.append(([r.token_ids for r in res], [st[k] for k in ("drafted", "accepted", "cycles")]))
            assert (st["cycles_ahead"] > 0) == ahead
        assert outs[0] == outs[1] and [len(t) for t in outs[1][0]] == list(lengths)
    finally:
        model.use_cuda_graphs = False


def test_graphs_a_warmup_captured_stay_beyond_the_lru_limit():
    """`GraphRunner.keeping`: nothing is evicted inside it, and afterwards the limit is max_graphs beyond what it
    held then (the eviction is on the host, so dummy entries stand in for captured graphs here)."""
    from gearshift.model.cuda_graphs import GraphRunner

    r = GraphRunner(max_graphs=3)
    with r.keeping():
        for k in range(5):
            r.graphs[("warm", k)] = object()
            r._evict()
        assert len(r.graphs) == 5
    assert r.reserved == 5
    for k in range(4):
        r.graphs[("served", k)] = object()
        r._evict()
    assert len(r.graphs) == 8 and ("warm", 0) not in r.graphs and ("served", 0) in r.graphs  # LRU still orders
    plain = GraphRunner(max_graphs=3)
    for k in range(5):
        plain.graphs[k] = object()
        plain._evict()
    assert list(plain.graphs) == [2, 3, 4]
