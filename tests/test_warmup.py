"""The server's start-up warm-up (`engine.warmup`): which shapes it runs, and that serving after it gives
the tokens a fresh engine gives, from the KV cache the warm-up left."""

import pytest

from gearshift.decode.autoregressive import AutoregressivePolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request
from gearshift.engine.warmup import WARMUP_NEW_TOKENS, prompt_lengths, warm_up, warmup_runs
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
    singles = [(n, t) for n, t, m in runs if m == "w4a8" and n == 1]
    full = [(n, t) for n, t, m in runs if m == "w4a8" and n == 4]
    short = [(n, t) for n, t, m in runs if m == "w4a8" and n == 3]
    assert [t for _, t in singles] == list(range(1, 17)) + [24, 32, 48, 64]
    assert [t for _, t in full] == [24, 32, 48, 64]
    assert [t for _, t in short] == [23, 31, 47, 63]  # odd row counts: Triton's other integer specialization
    assert len(runs) == 2 * (len(singles) + len(full) + len(short))
    assert all(n == 1 for n, _, _ in warmup_runs(1, 100, [None]))
    # with prefill graphs of up to 48 rows: the single sequence's 24-, 32- and 48-token prompts twice (the
    # second run captures the graph a sequence joining the batch replays), the others once
    graphed = warmup_runs(4, 64 + WARMUP_NEW_TOKENS, ["w4a8"], graph_rows=48)
    assert [t for n, t, _ in graphed if n == 1] == list(range(1, 17)) + [24, 24, 32, 32, 48, 48, 64]
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
