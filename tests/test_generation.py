import pytest
import torch

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.sampling import SamplingParams, filtered_logprobs
from gearshift.engine.engine import Engine, Request
from gearshift.model.loader import load_model, quantize_linears

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [3]]


@pytest.fixture(scope="module")
def int4_model(model_dir):
    lm = load_model(model_dir("tiny"), progress=False)
    quantize_linears(lm, "int4", 32, progress=False)
    return lm


def run(lm, prompts, params, batch=8, mode="w4a16"):
    eng = Engine(lm, max_batch=batch)
    return eng.generate([Request(p, params()) for p in prompts], AutoregressivePolicy(lm.model, mode)), eng


@pytest.mark.parametrize("params", [
    lambda: SamplingParams(max_new_tokens=10, ignore_eos=True),
    lambda: SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=7, max_new_tokens=10, ignore_eos=True),
])
def test_batched_equals_one_by_one(int4_model, params):
    batched, _ = run(int4_model, PROMPTS, params, batch=4)
    for p, r in zip(PROMPTS, batched):
        single, _ = run(int4_model, [p], params, batch=1)
        assert single[0].token_ids == r.token_ids


def test_continuous_batching_refills_slots(int4_model):
    params = lambda: SamplingParams(max_new_tokens=6, ignore_eos=True)  # noqa: E731
    small, eng = run(int4_model, PROMPTS, params, batch=2)
    assert eng.last_stats["batch"] == 2
    full, _ = run(int4_model, PROMPTS, params, batch=4)
    assert [r.token_ids for r in small] == [r.token_ids for r in full]


@pytest.mark.parametrize("penalty", [1.0, 3.0], ids=["plain", "repetition_penalty"])
def test_greedy_matches_transformers_generate(model_dir, penalty):
    """Greedy tokens equal transformers' generate, with its repetition penalty too (HF's
    RepetitionPenaltyLogitsProcessor is the definition: prompt + output tokens, logit / r above 0, * r below)."""
    transformers = pytest.importorskip("transformers")
    path = model_dir("tiny-qwen2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    lm = load_model(path, progress=False)
    prompt = [7, 8, 9, 10, 11, 12]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                          pad_token_id=0, repetition_penalty=penalty)[0, len(prompt):].tolist()
    out, _ = run(lm, [prompt], lambda: SamplingParams(max_new_tokens=16, ignore_eos=True, repetition_penalty=penalty),
                 mode="w16a16")
    assert out[0].token_ids == ref
    if penalty != 1.0:
        plain, _ = run(lm, [prompt], lambda: SamplingParams(max_new_tokens=16, ignore_eos=True), mode="w16a16")
        assert ref != plain[0].token_ids


def test_stop_token_and_length(int4_model):
    base, _ = run(int4_model, [PROMPTS[0]], lambda: SamplingParams(max_new_tokens=10, ignore_eos=True))
    toks = base[0].token_ids
    stop = toks[4]
    first = toks.index(stop)
    out, _ = run(int4_model, [PROMPTS[0]], lambda: SamplingParams(max_new_tokens=10, stop_token_ids=[stop]))
    assert out[0].token_ids == toks[: first + 1] and out[0].finish_reason == "stop"
    assert base[0].finish_reason == "length" and len(toks) == 10


def test_stop_string_and_streaming(int4_model):
    eng = Engine(int4_model, max_batch=2)
    prompt = eng.encode_prompt("hello world", chat=False)
    full = eng.generate([Request(prompt, SamplingParams(max_new_tokens=16, ignore_eos=True))],
                        AutoregressivePolicy(int4_model.model))[0]
    assert len(full.text) > 4
    stop = full.text[3:5]
    events = []
    res = eng.generate([Request(prompt, SamplingParams(max_new_tokens=16, ignore_eos=True, stop=[stop]))],
                       AutoregressivePolicy(int4_model.model), on_event=events.append)[0]
    assert res.text == full.text[: full.text.find(stop)] and res.finish_reason == "stop"
    assert "".join(e.text for e in events) == res.text and events[-1].finished


def test_filters():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    keep = lambda p: torch.isfinite(filtered_logprobs(logits, p)).nonzero().flatten().tolist()  # noqa: E731
    assert keep(SamplingParams(temperature=1, top_k=2)) == [0, 1]
    probs = torch.softmax(logits, 0)
    assert keep(SamplingParams(temperature=1, top_p=float(probs[0]) + 1e-3)) == [0, 1]
    assert keep(SamplingParams(temperature=1, min_p=float(probs[2] / probs[0]) - 1e-3)) == [0, 1, 2]
    lp = filtered_logprobs(logits, SamplingParams(temperature=1, top_k=3))
    assert torch.isclose(lp.exp().sum(), torch.tensor(1.0))


def test_seeded_sampling_is_reproducible(int4_model):
    p = lambda: SamplingParams(temperature=1.0, seed=3, max_new_tokens=8, ignore_eos=True)  # noqa: E731
    a, _ = run(int4_model, [PROMPTS[1]], p)
    b, _ = run(int4_model, [PROMPTS[1]], p)
    assert a[0].token_ids == b[0].token_ids


def test_stop_check_sees_every_token_of_a_multi_token_step(int4_model):
    """The stop check only reads tokens added since the last check (QSPEC appends several per
    step): a stop inside such a chunk still truncates right after it."""
    from gearshift.decode.base import Sequence

    eng = Engine(int4_model, max_batch=1)
    s = Sequence(0, [1, 2], SamplingParams(max_new_tokens=20, stop_token_ids=[9]))
    s.output = [5, 6]
    eng._check_stop(s, [])
    assert not s.finished and s.checked == 2
    s.output += [7, 9, 8, 9]
    eng._check_stop(s, [])
    assert s.finished and s.finish_reason == "stop" and s.output == [5, 6, 7, 9]


def _run_pipelined(lm, prompts, params, batch, pipelined):
    eng = Engine(lm, max_batch=batch)
    pol = AutoregressivePolicy(lm.model, "w4a16", pipelined=pipelined)
    return eng.generate([Request(p, prm) for p, prm in zip(prompts, params)], pol), pol, eng


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_one_step_ahead_gives_the_same_tokens(int4_model, batch):
    """The run-ahead AR loop (on by default on CUDA; forced here on the CPU, where it runs the same
    bookkeeping synchronously): same tokens as the plain loop under continuous batching (slots
    refilled), per-request lengths, a stop token mid-way, seeded sampled requests (drawn when a step is
    taken: a step dropped unread must not move their generators) and a penalized one (which drops back to
    the plain loop for those steps), and the cache positions it wrote ahead given back."""
    base, _, _ = _run_pipelined(int4_model, PROMPTS, [SamplingParams(max_new_tokens=9, ignore_eos=True)] * 4, 4,
                                False)
    stop = base[2].token_ids[3]
    params = [SamplingParams(max_new_tokens=9, ignore_eos=True), SamplingParams(max_new_tokens=3, ignore_eos=True),
              SamplingParams(max_new_tokens=9, stop_token_ids=[stop]),
              SamplingParams(max_new_tokens=7, ignore_eos=True)]
    prompts = PROMPTS + [PROMPTS[0][:3]]
    params = params + [SamplingParams(temperature=0.8, seed=3, max_new_tokens=5, ignore_eos=True),
                       SamplingParams(temperature=1.2, top_p=0.9, seed=4, max_new_tokens=8, ignore_eos=True),
                       SamplingParams(temperature=1.0, repetition_penalty=1.3, seed=5, max_new_tokens=4,
                                      ignore_eos=True)]
    prompts = prompts + [PROMPTS[1][:4], PROMPTS[2][:2]]
    plain, _, _ = _run_pipelined(int4_model, prompts, params, batch, False)
    ahead, pol, eng = _run_pipelined(int4_model, prompts, params, batch, True)
    assert [r.token_ids for r in ahead] == [r.token_ids for r in plain]
    assert [r.finish_reason for r in ahead] == [r.finish_reason for r in plain]
    assert plain[2].finish_reason == "stop" and len(plain[2].token_ids) < 9
    # steps whose tokens were used: one per generated token of the longest sequence in each batch
    assert pol.counters["forwards"] <= sum(len(r.token_ids) for r in ahead)
    if batch > 1:  # a sequence joining a running batch makes the step launched ahead be recomputed
        assert pol.counters.get("discarded_forwards", 0) >= 1


@pytest.mark.parametrize("policy", ["ar", "gearbox"])
def test_step_ahead_gives_cache_positions_back(int4_model, policy):
    """Dropping a step launched ahead (AR, GEARBX: `DecodePolicy._drop`) rolls back exactly the lengths it
    committed for the sequences still running, so their next step writes at the same positions."""
    from gearshift.decode.base import Sequence
    from gearshift.decode.gearbox import GearboxPolicy

    lm = int4_model
    if policy == "ar":
        pol = AutoregressivePolicy(lm.model, "w4a16", pipelined=True)
    else:
        pol = GearboxPolicy(lm.model, gears="high", pipelined=True)
    cache = lm.model.new_cache(2, 32)
    pol.bind(cache)
    seqs = [Sequence(i, list(p), SamplingParams(max_new_tokens=8, ignore_eos=True), slot=i)
            for i, p in enumerate(PROMPTS[:2])]
    pol.prefill(seqs, None)
    lengths = list(cache.lengths)
    pol.step(seqs, None)  # token 1, and the step for token 2 launched ahead
    assert cache.lengths == [n + 2 for n in lengths] and pol._ahead is not None
    assert [len(s.output) for s in seqs] == [1, 1]
    pol._drop(seqs[:1])  # only slot 0's sequence is still running
    assert cache.lengths == [lengths[0] + 1, lengths[1] + 2] and pol._ahead is None
    if policy == "gearbox":
        pol.close()


class _Scripted(AutoregressivePolicy):
    """Emits a fixed token list, `per_step` tokens at a time (like a QSPEC cycle), without the model."""

    def __init__(self, model, script, per_step):
        super().__init__(model, "w4a16", pipelined=False)
        self.script, self.per_step = script, per_step

    def prefill(self, seqs, sample):
        pass

    def step(self, seqs, sample):
        for s in seqs:
            s.output.extend(self.script[len(s.output):len(s.output) + self.per_step])


@pytest.mark.parametrize("per_step", [1, 3])
def test_stop_strings_and_streaming_over_long_outputs(int4_model, per_step):
    """Stop strings are found when they span steps, far into a long output (the text is kept
    incrementally), the output keeps the fewest tokens whose text reaches the stop, and the streamed
    pieces add up to the final text."""
    eng = Engine(int4_model, max_batch=2)
    tok = int4_model.tokenizer
    body = " ".join(f"w{i}" for i in range(60))
    script = tok(body + " the END marker" + " tail" * 20, add_special_tokens=False)["input_ids"]
    full = tok.decode(script, skip_special_tokens=True)
    cut = full.find("D mark")
    want = next(n for n in range(1, len(script) + 1) if len(tok.decode(script[:n])) > cut)
    events = []
    params = SamplingParams(max_new_tokens=len(script), stop=["D mark", "never"])
    res = eng.generate([Request([3], params)], _Scripted(int4_model.model, script, per_step), on_event=events.append)[0]
    assert res.finish_reason == "stop" and res.token_ids == script[:want]
    assert res.text == full[:cut] and "".join(e.text for e in events) == res.text
    assert len(events) > 30  # streamed as it went, not at the end


def test_empty_stop_string_is_refused():
    from gearshift.errors import GearshiftError

    with pytest.raises(GearshiftError, match="stop strings must not be empty"):
        SamplingParams(stop=["ok", ""])


def test_sequences_joining_a_batch_prefill_their_own_rows(int4_model):
    """A sequence refilling a slot of a running batch is prefilled over the slots the new group spans
    (here one row), not over the whole batch; the tokens are the same either way."""
    model = int4_model.model
    shapes = []
    orig = type(model).forward

    def spy(self, tokens, *a, **k):
        shapes.append(tuple(tokens.shape))
        return orig(self, tokens, *a, **k)

    params = lambda: SamplingParams(max_new_tokens=5, ignore_eos=True)  # noqa: E731
    outs = {}
    try:
        type(model).forward = spy
        for compact in (True, False):
            AutoregressivePolicy.compact_prefill = compact
            shapes.clear()
            outs[compact], _ = run(int4_model, PROMPTS, params, batch=2)
            prefills = [s for s in shapes if s[1] > 1]
            if compact:
                assert any(b == 1 for b, _ in prefills)  # a refill: one row
            else:
                assert all(b == 2 for b, _ in prefills)
    finally:
        type(model).forward = orig
        del AutoregressivePolicy.compact_prefill  # back to DecodePolicy's default
    assert [r.token_ids for r in outs[True]] == [r.token_ids for r in outs[False]]


def test_joining_sequences_far_apart_prefill_apart(int4_model):
    """Two sequences joining slots 0 and 3 around two running ones: one forward over slots 0..3 would run 2 x 70
    padding token rows, so each gets its own; short prompts, or adjacent slots, stay one forward."""
    pol = AutoregressivePolicy(int4_model.model, "w4a16")
    long, short = [1] * 70, [1] * 10
    assert pol.prefill_groups({0: long, 3: long}) == [{0: long}, {3: long}]
    assert pol.prefill_groups({3: long, 0: short}) == [{0: short}, {3: long}]  # the longest prompt pads the rest
    assert pol.prefill_groups({0: short, 3: short}) == [{0: short, 3: short}]  # 2 x 10 rows: cheaper than a forward
    assert pol.prefill_groups({0: long, 1: long, 5: long}) == [{0: long, 1: long}, {5: long}]
    pol.compact_prefill = False
    assert pol.prefill_groups({0: long, 3: long}) == [{0: long, 3: long}]

    # in the engine: the sequences in slots 0 and 3 finish together, and the two waiting ones take their slots
    model = int4_model.model
    prompts = [[5, 6], list(range(3, 13)), list(range(20, 30)), [7, 8], list(range(40, 111)), list(range(120, 191))]
    lengths = [3, 9, 9, 3, 4, 4]
    shapes, orig = [], type(model).forward

    def spy(self, tokens, *a, **k):
        shapes.append(tuple(tokens.shape))
        return orig(self, tokens, *a, **k)

    outs = []
    try:
        type(model).forward = spy
        for split in (128, 10**9):
            shapes.clear()
            pol = AutoregressivePolicy(model, "w4a16")
            pol.split_prefill_rows = split
            res = Engine(int4_model, max_batch=4).generate(
                [Request(q, SamplingParams(max_new_tokens=n, ignore_eos=True)) for q, n in zip(prompts, lengths)], pol)
            outs.append([r.token_ids for r in res])
            refills = [sh for sh in shapes if sh[1] >= 70]
            assert refills == ([(1, 70), (1, 70)] if split == 128 else [(4, 70)])
    finally:
        type(model).forward = orig
    assert outs[0] == outs[1]


def test_runs_of_one_size_reuse_the_kv_cache(int4_model):
    """A second run of the same batch and capacity takes the first run's cache (CUDA graphs are keyed on
    its addresses), masks what the slots still hold, and gives a fresh engine's tokens; a run closed
    early gives its cache back, a run of another size gets a new one."""
    params = lambda: SamplingParams(max_new_tokens=8, ignore_eos=True)  # noqa: E731
    policy = AutoregressivePolicy(int4_model.model, "w4a16")
    eng = Engine(int4_model, max_batch=2)
    long_a, long_b, short = list(range(3, 24)), list(range(30, 51)), [7, 8]
    eng.generate([Request(long_a, params()), Request(long_b, params())], policy)
    first = eng._cache
    second = eng.generate([Request(short, params()), Request(long_b[::-1], params())], policy)
    assert eng._cache is first
    fresh, _ = run(int4_model, [short, long_b[::-1]], params, batch=2)
    assert [r.token_ids for r in second] == [r.token_ids for r in fresh]

    events = eng.stream([Request(long_a, params()), Request(short, params())], policy)
    next(events)
    events.close()  # a client gone mid-run
    assert eng._cache is first
    again = eng.generate([Request(short, params()), Request(long_b[::-1], params())], policy)
    assert [r.token_ids for r in again] == [r.token_ids for r in fresh]

    eng.generate([Request(short, params())], policy)  # batch 1: another size
    assert eng._cache is not first and eng._cache.batch == 1


def test_cache_slots_share_storage():
    from gearshift.model.kv_cache import KVCache

    cache = KVCache(2, 4, 1, 8, 16)
    part = cache.slots(1, 2)
    assert part.batch == 2 and part.k.shape[1] == 2
    part.k[0, 1, 0, 3] = 7.0  # slot 2 of the cache
    assert cache.k[0, 2, 0, 3].eq(7.0).all()
    with pytest.raises(ValueError):
        cache.slots(3, 2)
    assert cache.root is cache and part.root is cache and part.slots(1, 1).root is cache


def test_copy_positions_moves_only_the_ranges_asked_for():
    """What a staged prefill copies between a slot and the staging cache (`GraphRunner.run`): positions
    start[b] .. stop[b] - 1 of each slot, keys and values, nothing else."""
    from gearshift.model.kv_cache import KVCache

    src = KVCache(3, 2, 2, 4, 10)
    src.k.normal_(), src.v.normal_()
    dst = src.like(2)
    assert dst.k.shape == src.k.shape and dst.k.dtype == src.k.dtype and dst.capacity == 10
    dst.k.fill_(-1.0), dst.v.fill_(-2.0)
    dst.copy_positions(src, [2, 5], [6, 5])  # slot 0: 2..5; slot 1: an empty range
    assert dst.k[:, 0, :, 2:6].equal(src.k[:, 0, :, 2:6]) and dst.v[:, 0, :, 2:6].equal(src.v[:, 0, :, 2:6])
    assert dst.k[:, 0, :, :2].eq(-1).all() and dst.k[:, 0, :, 6:].eq(-1).all() and dst.k[:, 1].eq(-1).all()
    assert dst.v[:, 0, :, :2].eq(-2).all() and dst.v[:, 0, :, 6:].eq(-2).all() and dst.v[:, 1].eq(-2).all()


def test_frequency_and_presence_penalties_follow_their_definition(int4_model):
    """Greedy decoding with OpenAI's penalties equals a loop that re-runs the whole sequence and penalizes
    the raw logits by hand (f * count + p * [count > 0] over the output); in a batch, a plain request next to
    a penalized one keeps its own tokens."""
    from gearshift.decode.sampling import apply_penalties

    x = torch.tensor([2.0, -1.0, 0.5, 3.0])
    got = apply_penalties(x, SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
                          prompt=[1], output=[3, 3, 0])
    assert torch.allclose(got, torch.tensor([1.0 - 0.75, -2.0, 0.5, 1.5 - 1.25]))

    model = int4_model.model
    prompt = PROMPTS[0]
    params = SamplingParams(max_new_tokens=10, ignore_eos=True, frequency_penalty=1.5, presence_penalty=0.5)
    ids, out = list(prompt), []
    for _ in range(10):
        cache = model.new_cache(1, len(ids) + 1)
        logits = model.forward_lists(torch.tensor([ids]), cache, [0], [len(ids)], len(ids), "w4a16", "all")[0, -1]
        tok = int(apply_penalties(logits.float(), params, prompt, out).argmax())
        out.append(tok)
        ids.append(tok)
    eng = Engine(int4_model, max_batch=2)
    penalized, plain = eng.generate([Request(prompt, params), Request(PROMPTS[1], SamplingParams(
        max_new_tokens=10, ignore_eos=True))], AutoregressivePolicy(int4_model.model, "w4a16"))
    assert penalized.token_ids == out
    alone, _ = run(int4_model, [PROMPTS[1]], lambda: SamplingParams(max_new_tokens=10, ignore_eos=True))
    assert plain.token_ids == alone[0].token_ids


def test_policies_that_sample_their_own_way_refuse_penalties(int4_model):
    from gearshift.decode.gearbox import GearboxPolicy
    from gearshift.decode.qspec import QSpecPolicy
    from gearshift.errors import GearshiftError

    params = SamplingParams(max_new_tokens=4, ignore_eos=True, repetition_penalty=1.2)
    for policy in (QSpecPolicy(int4_model.model, draft_mode="w4a8"), GearboxPolicy(int4_model.model)):
        with pytest.raises(GearshiftError, match="need the ar policy"):
            Engine(int4_model, max_batch=1).generate([Request(PROMPTS[0], params)], policy)
