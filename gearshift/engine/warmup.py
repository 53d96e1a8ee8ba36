"""A server's start-up warm-up: the engine run once over the shapes that serving will meet.

Triton compiles a kernel the first time it meets a tile configuration (or a token count, for the
few-token kernels), and the policy map picks other tiles for every M bucket: at 8B scale the first
prefill of a new size stalls the whole running batch for seconds (a serve_load run at concurrency 16
on an H200 measured 6 s, inside fifteen requests' TTFT). Warming up runs, in the server's own KV cache
(the one its loop takes next), prefills of every token count up to 16 and of every token bucket
(`cuda_graphs.token_bucket`) for one sequence and for a full batch, each followed by decode steps, in
every mode the policy serves, the same one sequence short at one token less (odd row counts), and a few
sequences at each narrower decode width the policy steps at (`DecodePolicy.decode_widths`).
Shapes beyond those (a refill group of 5 at 384 tokens) fall in the same M buckets and reuse the
compiled kernels.
"""

from __future__ import annotations

import sys
import time

from gearshift.decode.base import DecodePolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request
from gearshift.model.cuda_graphs import context_buckets, token_bucket

#: tokens each warm-up sequence generates: a prefill, then decode steps (QSPEC: a draft-verify cycle)
WARMUP_NEW_TOKENS = 2


def prompt_lengths(max_prompt: int) -> list[int]:
    """Every prompt length up to 16, then one per token bucket above it (a prompt of its length, or the
    longest that fits where that is shorter: it runs padded to the bucket), up to `max_prompt`."""
    out = list(range(1, min(16, max_prompt) + 1))
    t = 17
    while t <= max_prompt:
        b = token_bucket(t)
        out.append(min(b, max_prompt))
        t = b + 1
    return out


def warmup_runs(max_batch: int, max_seq_len: int, modes: list[str | None],
                widths: list[int] = (), graph_rows: int = 0) -> list[tuple[int, int, str | None]]:
    """(sequences, prompt tokens, mode) of each warm-up run: one sequence at every length; the full batch at
    the bucketed lengths (17+), so prefills of 1..max_batch * max_prompt rows meet their M bucket; and one
    sequence fewer at one token less, since Triton compiles an integer argument divisible by 16 apart from
    one that is not (a long prefill runs unpadded: 15 prompts of up to 333 tokens make 4995 rows). Then, for
    each decode width between one sequence and the full batch (`DecodePolicy.decode_widths`), that many
    sequences of 16 and of 17 tokens (decode steps of that many rows, with a key count divisible by 16 and
    one that is not) and of one token under each context bucket (`cuda_graphs.context_buckets`): a decode
    graph per width and bucket, captured here and not in the middle of a server's batch (100-200 ms each at
    8B scale). A prefill of 17 or more tokens is captured the second time its shape is seen, so the single
    sequence's prompts padded to up to `graph_rows` tokens (`Transformer.graph_max_rows`; 0: no graphs) run
    twice: a sequence joining a running batch then replays that graph, in whichever slot it lands
    (`GraphRunner.run`), where a server on an H200 captured one per slot while serving (80 ms each)."""
    max_prompt = max_seq_len - WARMUP_NEW_TOKENS
    lengths = prompt_lengths(max_prompt)
    runs = []
    for mode in modes:
        runs += [(1, t, mode) for t in lengths for _ in range(2 if 16 < token_bucket(t) <= graph_rows else 1)]
        for t in (t for t in lengths if t > 16):
            runs += [(max_batch, t, mode)] if max_batch > 1 else []
            runs += [(max_batch - 1, t - 1, mode)] if max_batch > 2 else []
        narrow = [t for t in (16, 17) if t <= max_prompt]
        narrow += [t for t in sorted({min(b - 1, max_prompt) for b in context_buckets(max_seq_len)}) if t > 17]
        for w in (w for w in widths if 1 < w < max_batch):
            runs += [(w, t, mode) for t in narrow]
    return runs


def warm_up(engine: Engine, policy: DecodePolicy, progress: bool = True) -> tuple[int, float]:
    """Run `warmup_runs` through the engine's request loop at the server's batch and context (greedy, past
    EOS); returns (runs, seconds). The KV cache it used is the one a server's loop takes next, so decode
    graphs captured here are replayed there."""
    modes: list[str | None] = list(policy.modes) if len(policy.modes) > 1 else [None]
    model = engine.loaded.model
    graph_rows = model.graph_max_rows if model.use_cuda_graphs else 0
    runs = warmup_runs(engine.max_batch, engine.max_seq_len, modes, policy.decode_widths(engine.max_batch), graph_rows)
    vocab = engine.loaded.config.vocab_size
    it = runs
    if progress:
        from tqdm import tqdm

        it = tqdm(runs, desc="warming up (kernel compiles)", leave=False, file=sys.stderr, disable=None)
    t0 = time.perf_counter()
    for n, length, mode in it:
        engine.run_in_serving_cache([Request([(7 + 31 * (i + j)) % vocab for j in range(length)],
                                             SamplingParams(max_new_tokens=WARMUP_NEW_TOKENS, ignore_eos=True),
                                             mode=mode) for i in range(n)], policy)
    return len(runs), time.perf_counter() - t0
