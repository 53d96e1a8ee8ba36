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

import contextlib
import sys
import time
from typing import NamedTuple

from gearshift.decode.base import DecodePolicy
from gearshift.decode.sampling import SamplingParams
from gearshift.engine.engine import Engine, Request
from gearshift.model.cuda_graphs import context_buckets, token_bucket

#: tokens each warm-up sequence generates at least: a prefill, then decode steps (QSPEC: as many as its widest
#: verify pass feeds, `warmup_runs`)
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


class WarmupRun(NamedTuple):
    """One warm-up run: `sequences` requests of `new_tokens` tokens each in `mode`, the first of `prompt_tokens`
    prompt tokens and the others of `others` (None: the same). A decode step's graph is keyed on its width and
    its longest row's reach, so the runs that are there for decode graphs give the other rows short prompts."""
    sequences: int
    prompt_tokens: int
    mode: str | None
    new_tokens: int
    others: int | None = None


#: prompt tokens of the short rows of a decode-width run (`WarmupRun.others`)
SHORT_PROMPT = 16


def context_lengths(max_seq_len: int, feed: int) -> list[int]:
    """Prompt lengths whose first decode step, feeding `feed` tokens per row (the prompt's last one and, for QSPEC,
    feed - 1 drafts) and asking for `feed` new tokens, reaches each context bucket (`cuda_graphs.context_buckets`)
    from below its top: 16 and 17 (a key count divisible by 16 and one that is not), then one per bucket."""
    top = max_seq_len - feed  # the prompt and its new tokens fit the sequence
    out = [t for t in (16, 17) if t <= top]
    return out + [t for t in sorted({min(b + 1 - feed, top) for b in context_buckets(max_seq_len)}) if t > 17]


def warmup_runs(max_batch: int, max_seq_len: int, modes: list[str | None], widths: list[int] = (),
                graph_rows: int = 0, feeds: list[int] = (1,)) -> list[WarmupRun]:
    """The warm-up's runs (`WarmupRun`): one sequence at every length; the full
    batch at the bucketed lengths (17+), so prefills of 1..max_batch * max_prompt rows meet their M bucket; and
    one sequence fewer at one token less, since Triton compiles an integer argument divisible by 16 apart from
    one that is not (a long prefill runs unpadded: 15 prompts of up to 333 tokens make 4995 rows). Then, for
    each decode width between one sequence and the full batch (`DecodePolicy.decode_widths`), that many
    sequences of 16 and of 17 tokens (decode steps of that many rows, with a key count divisible by 16 and
    one that is not) and of one token under each context bucket (`cuda_graphs.context_buckets`): a decode
    graph per width and bucket, captured here and not in the middle of a server's batch (100-200 ms each at
    8B scale). A prefill of 17 or more tokens is captured the second time its shape is seen, so the single
    sequence's prompts padded to up to `graph_rows` tokens (`Transformer.graph_max_rows`; 0: no graphs) run
    twice: a sequence joining a running batch then replays that graph, in whichever slot it lands
    (`GraphRunner.run`), where a server on an H200 captured one per slot while serving (80 ms each).

    feeds: the tokens per row a decode step can feed (`DecodePolicy.step_feeds`; QSPEC: a verify pass of 1 to
    gamma + 1). Each is a graph of its own per width and bucket: the runs ask for the widest feed's tokens, so
    their first step feeds it, and each narrower feed gets the decode widths' runs of its own (a QSPEC server
    had captured its 3- and 4-token verify graphs while serving: 4 of them, 0.43 s, on an H100)."""
    new = max(WARMUP_NEW_TOKENS, *feeds)
    max_prompt = max_seq_len - new
    lengths = prompt_lengths(max_prompt)
    narrower = [k for k in feeds if k < max(feeds)]  # the other runs' first step feeds the widest
    every_width = sorted({*widths, max_batch})
    runs = []
    for mode in modes:
        runs += [WarmupRun(1, t, mode, new) for t in lengths
                 for _ in range(2 if 16 < token_bucket(t) <= graph_rows else 1)]
        for t in (t for t in lengths if t > 16):
            runs += [WarmupRun(max_batch, t, mode, new)] if max_batch > 1 else []
            runs += [WarmupRun(max_batch - 1, t - 1, mode, new)] if max_batch > 2 else []
        for w in (w for w in widths if 1 < w < max_batch):
            runs += [WarmupRun(w, t, mode, new, SHORT_PROMPT) for t in context_lengths(max_seq_len, new)]
        for k in narrower:
            runs += [WarmupRun(w, t, mode, k, SHORT_PROMPT) for w in every_width
                     for t in context_lengths(max_seq_len, k)]
    return runs


def warm_up(engine: Engine, policy: DecodePolicy, progress: bool = True) -> tuple[int, float]:
    """Run `warmup_runs` through the engine's request loop at the server's batch and context (greedy, past
    EOS); returns (runs, seconds). The KV cache it used is the one a server's loop takes next, so decode
    graphs captured here are replayed there."""
    modes: list[str | None] = list(policy.modes) if len(policy.modes) > 1 else [None]
    model = engine.loaded.model
    graph_rows = model.graph_max_rows if model.use_cuda_graphs else 0
    runs = warmup_runs(engine.max_batch, engine.max_seq_len, modes, policy.decode_widths(engine.max_batch), graph_rows,
                       list(policy.step_feeds()))
    vocab = engine.loaded.config.vocab_size
    it = runs
    if progress:
        from tqdm import tqdm

        it = tqdm(runs, desc="warming up (kernel compiles)", leave=False, file=sys.stderr, disable=None)
    t0 = time.perf_counter()
    cuda_graphs = model.use_cuda_graphs and model.device.type == "cuda"
    with model._graph_runner().keeping() if cuda_graphs else contextlib.nullcontext():
        for r in it:
            lengths = [r.prompt_tokens] + [r.prompt_tokens if r.others is None else r.others] * (r.sequences - 1)
            engine.run_in_serving_cache([Request([(7 + 31 * (i + j)) % vocab for j in range(length)],
                                                 SamplingParams(max_new_tokens=r.new_tokens, ignore_eos=True),
                                                 mode=r.mode) for i, length in enumerate(lengths)], policy)
    return len(runs), time.perf_counter() - t0
