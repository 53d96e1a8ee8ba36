"""The server's start-up warm-up (`engine.warmup`): which shapes it runs, and that serving after it gives
the tokens a fresh engine gives, from the KV cache the warm-up left."""

import pytest

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request
from gearshift.engine.warmup import SHORT_PROMPT, WARMUP_NEW_TOKENS, prompt_lengths, warm_up, warmup_runs
from gearshift.model.cuda_graphs import token_bucket
from gearshift.model.loader import load_model, quantize_linears


def test_prompt_lengths_cover_every_bucket_that_fits():
    lengths = prompt_lengths(2046)
    assert lengths[:16] == list(range(1, 17))
    assert lengths[16:] == [24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2046]
    # every prompt length that fits pads to a bucket some warm-up prompt pads to
    assert {token_bucket(t) for t in range(1, 2047)} == {token_bucket(t) for t in lengths}
    assert prompt_lengths(20) == list(range(1, 17)) + [20]
    assert prompt_lengths(5) == [1, 2, 3, 4, 5]


def test_warmup_runs_one_sequence_and_a_full_batch_per_mode():
    runs = warmup_runs(4, 64 + WARMUP_NEW_TOKENS, ["w4a16", "w4a8"])
    singles = [(r.sequences, r.prompt_tokens) for r in runs if r.mode == "w4a8" and r.sequences == 1]
    full = [(r.sequences, r.prompt_tokens) for r in runs if r.mode == "w4a8" and r.sequences == 4]
    short = [(r.sequences, r.prompt_tokens) for r in runs if r.mode == "w4a8" and r.sequences == 3]
    assert [t for _, t in singles] == list(range(1, 17)) + [24, 32, 48, 64]
    assert [t for _, t in full] == [24, 32, 48, 64]
    assert [t for _, t in short] == [23, 31, 47, 63]  # odd row counts: Triton's other integer specialization
    assert len(runs) == 2 * (len(singles) + len(full) + len(short))
    assert all(r.sequences == 1 for r in warmup_runs(1, 100, [None]))
    assert {r.new_tokens for r in runs} == {WARMUP_NEW_TOKENS} and {r.others for r in runs} == {None}
    # with prefill graphs of up to 48 rows: the single sequence's 24-, 32- and 48-token prompts twice (the
    # second run captures the graph a sequence joining the batch replays), the others once
    graphed = warmup_runs(4, 64 + WARMUP_NEW_TOKENS, ["w4a8"], graph_rows=48)
    assert [r.prompt_tokens for r in graphed if r.sequences == 1] == list(range(1, 17)) + [24, 24, 32, 32, 48, 48, 64]
    assert [r for r in graphed if r[0] > 1] == [r for r in runs if r[2] == "w4a8" and r[0] > 1]


@pytest.fixture(scope="module")
def int4_model(model_dir):
    lm = load_model(model_dir("tiny"), progress=False)
    quantize_linears(lm, "int4", 32, progress=False)
    return lm


def test_serving_after_warmup_gives_a_fresh_engines_tokens(int4_model):
    params = lambda: SamplingParams(max_new_tokens=6, ignore_eos=True)  # noqa: E731
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    policy = AutoregressivePolicy(int4_model.model, "w4a16")
    eng = Engine(int4_model, max_batch=2, max_seq_len=40)
    runs, seconds = warm_up(eng, policy, progress=False)
    assert runs == len(warmup_runs(2, 40, [None])) and seconds > 0
    warm = eng._cache
    assert warm.batch == 2 and warm.capacity == 40 + policy.lookahead + 1

    pending = [[(i, Request(p, params())) for i, p in enumerate(prompts)]]
    out: dict[int, list[int]] = {}
    for ev in eng.serve(lambda idle: pending.pop() if pending else None, policy, prefix_reuse=False):
        out.setdefault(ev.index, []).extend(ev.token_ids)
    assert eng._cache is warm  # the server's loop took the warm-up's cache (and its CUDA graphs' addresses)
    fresh = Engine(int4_model, max_batch=2).generate([Request(p, params()) for p in prompts], policy)
    assert [out[i] for i in range(len(prompts))] == [r.token_ids for r in fresh]


def test_warmup_leaves_no_sequences_in_the_policy(int4_model):
    """A GEARBX policy keeps every sequence it serves for telemetry, until the engine forgets it: the
    warm-up's must not stay for the server's life (a GPU run of the server tests found 31 there)."""
    from gearshift.decode.gearbox import GearboxPolicy

    policy = GearboxPolicy(int4_model.model, gears="high")
    runs, _ = warm_up(Engine(int4_model, max_batch=2, max_seq_len=24), policy, progress=False)
    assert runs > 0 and policy.sequences == []


def test_warmup_runs_every_verify_width_of_qspec_at_every_decode_width_and_bucket():
    """QSPEC's verify pass feeds 1 + budget tokens per row (1..gamma + 1), each a graph per decode width and
    context bucket: the runs ask for gamma + 1 tokens (the first cycle feeds them all), and each narrower feed
    gets a run per width and bucket that asks for exactly its tokens."""
    runs = warmup_runs(4, 300, [None], [1, 2, 4], feeds=[1, 2, 3, 4])
    assert {r.new_tokens for r in runs if r.sequences in (1, 4) and r.prompt_tokens < 20} == {1, 2, 3, 4}
    for k in (1, 2, 3):
        got = sorted({(r.sequences, r.prompt_tokens) for r in runs if r.new_tokens == k})
        # the first step writes positions t - 1 .. t + k - 2: it reaches the bucket's top (128, 256, 300)
        assert got == sorted((n, t) for n in (1, 2, 4) for t in (16, 17, 129 - k, 257 - k, 300 - k))
    assert all(r.prompt_tokens + r.new_tokens <= 300 for r in runs)
    # a decode step's graph is keyed on its longest row: only the first sequence of these runs has the long prompt
    assert {r.others for r in runs if r.new_tokens < 4} == {SHORT_PROMPT}
    # an AR policy (one token per step) runs what it ran before the feeds existed
    assert warmup_runs(4, 300, [None], [1, 2, 4]) == warmup_runs(4, 300, [None], [1, 2, 4], feeds=[1])


def _short_step_shapes(model, monkeypatch, policy) -> set:
    """Records (rows, tokens, context bucket, mode, logits) of every draft and verify forward: the key of the
    CUDA graph a GPU would replay for it (`GraphRunner._key`, less the addresses)."""
    from gearshift.model.cuda_graphs import context_buckets

    seen: set = set()

    def key(tokens, cache, upto, mode, logits):
        if mode == policy.draft_mode or logits == "all":
            bucket = next(b for b in context_buckets(cache.capacity) if b >= min(upto, cache.capacity))
            seen.add((tokens.shape[0], tokens.shape[1], bucket, mode, logits))

    lists, tensors = model.forward_lists, model.forward_tensors

    def forward_lists(tokens, cache, start, n_new, upto, mode, logits):
        key(tokens, cache, upto, mode, logits)
        return lists(tokens, cache, start, n_new, upto, mode, logits)

    def forward_tensors(tokens, positions, n_new, cache, upto, mode, logits):
        key(tokens, cache, upto, mode, logits)
        return tensors(tokens, positions, n_new, cache, upto, mode, logits)

    monkeypatch.setattr(model, "forward_lists", forward_lists)
    monkeypatch.setattr(model, "forward_tensors", forward_tensors)
    return seen


@pytest.mark.parametrize("feeds", ["policy", "one token"])
def test_qspec_serving_meets_no_step_shape_its_warmup_did_not(int4_model, monkeypatch, feeds):
    """Every draft and verify step a QSPEC server runs has the shape of one its warm-up ran (so on a GPU its
    graph was captured before the first request). Before the warm-up ran the policy's feeds, a QSPEC server on
    an H100 captured 4 verify graphs while serving; the "one token" case is that warm-up, and must miss some."""
    from gearshift.decode.qspec import QSpecPolicy

    model = int4_model.model
    policy = QSpecPolicy(model, draft_mode="w4a8", verify_mode="w4a16", gamma=3)
    if feeds == "one token":
        monkeypatch.setattr(policy, "step_feeds", lambda: range(1, 2))
    eng = Engine(int4_model, max_batch=2, max_seq_len=160)
    shapes = _short_step_shapes(model, monkeypatch, policy)
    warm_up(eng, policy, progress=False)
    warmed = set(shapes)
    shapes.clear()
    prompts = [[(5 + 7 * j) % 90 + 3 for j in range(n)] for n in (5, 40, 126, 150, 8)]
    pending = [[(i, Request(p, SamplingParams(max_new_tokens=new, ignore_eos=True)))
                for i, (p, new) in enumerate(zip(prompts, (9, 6, 7, 5, 3)))]]
    for _ in eng.serve(lambda idle: pending.pop() if pending else None, policy, prefix_reuse=False):
        pass
    assert {3, 4} <= {s[1] for s in shapes if s[4] == "all"}  # verify passes the old warm-up never ran
    missed = shapes - warmed
    assert (not missed) if feeds == "policy" else missed, sorted(missed)
