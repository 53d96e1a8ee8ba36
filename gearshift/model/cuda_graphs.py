"""CUDA-graph replay of short forwards (decode steps, QSPEC draft and verify).

A decode step of an 8B model launches hundreds of small kernels; from Python that is
host-bound at small batch. Each distinct (batch, tokens, mode, logits, attention bucket,
addresses of the weight stores and of the cache, the kernel switches, the active dispatcher) gets
one captured graph whose inputs are static device buffers: the step copies its token ids,
positions and lengths in, replays, and clones the logits out. (A dispatcher installed later, e.g.
another policy map, picks other kernels: graphs captured under the previous one are not replayed.)
Attention length is rounded up to a bucket (masked keys contribute nothing), so a handful of
graphs serve a whole generation. Swapping a layer's store (a GEARBX gear shift) changes the
key, so a graph never runs on stale weights; graphs of a re-entered gear are reused.

Longer steps (prefills of up to `Transformer.graph_max_rows` rows) are host-bound too: an eager
forward of an 8B model spends 30-60 ms launching ~320 kernels, whatever its length up to about
a thousand tokens. They run padded to a token bucket (`token_bucket`), so that a handful of
shapes recur, and are captured only when their key is seen again: the first one runs eagerly
(the same computation, at the same bucketed shapes), so a one-off prompt does not pay a capture.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from contextlib import contextmanager

import torch

from gearshift.dispatch import get_dispatcher
from gearshift.kernels import switches
from gearshift.kernels.pdl import pdl_enabled
from gearshift.model.quant_linear import store_version


def _bucket(n: int) -> int:
    b = 128
    while b < n:
        b *= 2
    return b


def context_buckets(capacity: int) -> list[int]:
    """The key counts a graph is captured for (each step's reach rounded up: 128, 256, ...), in a cache of
    `capacity` positions per slot; the last one is the capacity itself where that is smaller."""
    out = [128]
    while out[-1] < capacity:
        out.append(out[-1] * 2)
    return [min(b, capacity) for b in out]


def token_bucket(t: int) -> int:
    """Tokens per row a step of t tokens runs padded to: 2^k or 1.5 * 2^k (t itself up to 16), so
    steps of 17..1024 tokens share 12 shapes and no step computes more than 1.5x its rows."""
    if t <= 16:
        return t
    b = 16
    while True:
        if b * 3 // 2 >= t:
            return b * 3 // 2
        b *= 2
        if b >= t:
            return b


def _layout(cache) -> tuple:
    """What a cache's slots look like (layers, heads, positions, head size, dtype, device), whatever their count."""
    k = cache.k
    return k.shape[0], *k.shape[2:], k.dtype, k.device


class _Graph:
    def __init__(self, model, cache, b: int, t: int, upto: int, mode: str, logits: str, pool, warmups: int = 2):
        dev = model.device
        self.tokens = torch.zeros((b, t), dtype=torch.long, device=dev)
        self.positions = torch.zeros((b, t), dtype=torch.long, device=dev)
        self.n_new = torch.zeros((b,), dtype=torch.long, device=dev)
        self.host = torch.zeros((2, b, t), dtype=torch.long).pin_memory()
        self.staged = torch.cuda.Event()  # recorded after each copy out of `host`
        self.staged.record()
        args = (self.tokens, self.positions, self.n_new, cache, upto, mode, logits)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up: Triton compiles, autotuners settle, allocator fills
            for _ in range(warmups):
                model.forward_tensors(*args)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = model.forward_tensors(*args)

    def run(self, tokens: torch.Tensor, start: list[int], n_new: list[int]) -> torch.Tensor:
        b, t = tokens.shape
        h = self.host
        # a caller running a step ahead (AutoregressivePolicy) comes back before the GPU has made the
        # last copy out of `host`: wait for that copy (not for the step) before overwriting it
        self.staged.synchronize()
        h[0].copy_(torch.tensor(start).unsqueeze(1) + torch.arange(t).unsqueeze(0))
        h[1, :, 0].copy_(torch.tensor(n_new))
        staged = h.to(self.tokens.device, non_blocking=True)
        self.staged.record()
        self.tokens.copy_(tokens, non_blocking=True)
        self.positions.copy_(staged[0])
        self.n_new.copy_(staged[1, :, 0])
        self.graph.replay()
        return self.out.clone()

    def run_tensors(self, tokens: torch.Tensor, positions: torch.Tensor, n_new: torch.Tensor) -> torch.Tensor:
        """The step on inputs already on the device (no host data): it can be queued before earlier
        results have been read back."""
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.n_new.copy_(n_new)
        self.graph.replay()
        return self.out.clone()


class GraphRunner:
    """Captured graphs of one model, least recently used first out."""

    def __init__(self, max_graphs: int = 96):
        self.graphs: OrderedDict = OrderedDict()
        self.max_graphs = max_graphs
        self.seen: OrderedDict = OrderedDict()  # keys of long steps run once eagerly, not captured yet
        self.pool = None
        self._version = None
        self._signature = None
        self.captures = 0
        self.capture_s = 0.0  # host seconds in captures (their warm-up forwards included): a server's stall
        self.recent: deque = deque(maxlen=64)  # the latest captures' shapes: which ones a server's warm-up missed
        self.staging = None  # the KV cache relocatable steps run in (`run`)
        self.reserved = 0  # graphs held beyond max_graphs: those a server's warm-up captured (`keeping`)

    def _stores(self, model) -> tuple:
        v = store_version()
        if v != self._version:
            self._version = v
            # graphs hold device addresses: key on the tensors' addresses, not on module identity
            # (a store moved to host and back is the same module with new tensors)
            self._signature = tuple(t.data_ptr() for _, lin in model.linear_layers() for t in lin.buffers())
        return self._signature

    #: slots of the staging cache that relocatable steps run in (`run`); each costs one slot of the KV cache's memory
    staging_rows = 1

    def run(self, model, tokens, cache, start, n_new, upto, mode, logits, capture_at_once: bool = True,
            relocatable: bool = False) -> torch.Tensor:
        """The step's logits from its graph. capture_at_once=False: a key seen for the first time
        runs eagerly at the graph's shapes (same computation) and is captured when seen again.

        relocatable=True (a prefill of sequences joining a running batch, on `KVCache.slots`): a graph holds
        its cache's addresses, so each slot a prefill lands in would capture its own graph (a server met a
        100 ms capture per slot and prompt bucket, stalling the batch each time). Views of up to
        `staging_rows` slots run instead in a staging cache of the same layout: the rows' cached prefixes
        are copied in, the graph replays there, and the positions it wrote are copied back. One graph then
        serves every slot; the copies move the prefix and the new positions only."""
        b, t = tokens.shape
        at = self._staging(cache, b) if relocatable and cache.root is not cache and b <= self.staging_rows else cache
        key, bucket = self._key(model, b, t, at, upto, mode, logits)
        if key not in self.graphs and not capture_at_once and key not in self.seen:
            self.seen[key] = True
            while len(self.seen) > 4 * self.max_graphs:
                self.seen.popitem(last=False)
            return model.forward_lists(tokens, cache, start, n_new, bucket, mode, logits)
        graph = self._graph(model, key, b, t, at, bucket, mode, logits)
        if at is cache:
            return graph.run(tokens, start, n_new)
        at.copy_positions(cache, [0] * b, [s if n else 0 for s, n in zip(start, n_new)])
        out = graph.run(tokens, start, n_new)
        cache.copy_positions(at, start, [s + n for s, n in zip(start, n_new)])
        return out

    def _evict(self) -> None:
        while len(self.graphs) > self.max_graphs + self.reserved:
            self.graphs.popitem(last=False)

    @contextmanager
    def keeping(self):
        """Inside, no graph is evicted; after, the limit is `max_graphs` beyond the graphs held then. A server's
        warm-up runs inside: a QSPEC server's warm-up captures a graph per decode width, context bucket and verify
        width (about 180 at batch 16 and 2048 tokens), and the plain limit had evicted its first ones, which the
        server then captured again while serving (7, 0.88 s, on an H100)."""
        self.reserved = math.inf
        try:
            yield self
        finally:
            self.reserved = len(self.graphs)
            self._evict()

    def _staging(self, cache, b: int):
        """`b` slots of the staging cache, laid out as `cache` (allocated at first use, again if the layout changes)."""
        root, st = cache.root, self.staging
        if st is None or _layout(st) != _layout(root):
            self.staging = st = root.like(self.staging_rows)
        return st if b == st.batch else st.slots(0, b)

    def run_tensors(self, model, tokens, positions, n_new, cache, upto, mode, logits) -> torch.Tensor:
        """`run` on positions [B, T] and lengths [B] already on the device (captured at first sight)."""
        b, t = tokens.shape
        key, bucket = self._key(model, b, t, cache, upto, mode, logits)
        return self._graph(model, key, b, t, cache, bucket, mode, logits).run_tensors(tokens, positions, n_new)

    def _key(self, model, b, t, cache, upto, mode, logits) -> tuple[tuple, int]:
        bucket = min(_bucket(upto), cache.capacity)
        return (b, t, bucket, str(mode), logits, cache.k.data_ptr(), cache.v.data_ptr(), tuple(cache.k.shape),
                self._stores(model), switches.state(), pdl_enabled(cache.k), get_dispatcher()), bucket

    def _graph(self, model, key, b, t, cache, bucket, mode, logits) -> _Graph:
        g = self.graphs.get(key)
        if g is None:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            # warm-up forwards write this step's K/V: the replay rewrites the same values. A key seen
            # before has its kernels compiled: one warm-up is enough there
            seen = self.seen.pop(key, None) is not None
            t0 = time.perf_counter()
            g = _Graph(model, cache, b, t, bucket, mode, logits, self.pool, warmups=1 if seen else 2)
            dt = time.perf_counter() - t0
            self.capture_s += dt
            self.captures += 1
            self.recent.append({"rows": b, "tokens": t, "context": bucket, "mode": str(mode), "logits": logits,
                                "seconds": round(dt, 3)})
            self.graphs[key] = g
            self._evict()
        else:
            self.graphs.move_to_end(key)
        return g
