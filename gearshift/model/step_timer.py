"""The model's graphed decode step as a timing target (GPU): what `gearshift profile --refine` and
benchmarks/step_search.py --engine rank tile choices on.

Whole generations (prefill, decode steps, host work between them) vary 2-3% between rounds, too much to
rank tiles that differ by 1%. This captures the decode step the engine replays (`GraphRunner` over the
model's `forward_tensors`: norms, RoPE + KV write, decode attention, SwiGLU, lm_head, launched with PDL
as the engine launches them) once per dispatcher and times back-to-back replays with CUDA events;
repeated timings agree within 0.5% on the H100. Attention reads `context` cached keys of random content
(the time does not depend on the values).
"""

from __future__ import annotations

import statistics

import torch

from gearshift.dispatch import get_dispatcher, set_dispatcher
from gearshift.model.cuda_graphs import GraphRunner
from gearshift.model.kv_cache import KVCache


class DecodeStepTimer:
    """One decode step of `model` at a batch and context, timed under any dispatcher. With `tokens` > 1,
    a pass of that many new tokens per sequence with every position's logits: QSPEC's verify pass."""

    def __init__(self, model, mode: str, batch: int, context: int = 512, seed: int = 0, max_graphs: int = 2,
                 tokens: int = 1):
        if not torch.cuda.is_available() or model.device.type != "cuda":
            raise RuntimeError("DecodeStepTimer times CUDA graphs: it needs the model on a CUDA GPU")
        self.model, self.mode, self.context = model, mode, int(context)
        self.cache = KVCache.for_model(model.config, batch, self.context + max(8, tokens), model.dtype, model.device)
        self.cache.k.normal_()
        self.cache.v.normal_()
        gen = torch.Generator(device=model.device).manual_seed(seed)
        self.tokens = torch.randint(0, model.config.vocab_size, (batch, tokens), device=model.device, generator=gen)
        self.start, self.n_new = [self.context] * batch, [tokens] * batch
        self.logits = "last" if tokens == 1 else "all"
        # each capture holds its memory pool: keep only the last ones (more when several settings alternate)
        self.runner = GraphRunner(max_graphs=max_graphs)

    def _step(self):
        return self.runner.run(self.model, self.tokens, self.cache, self.start, self.n_new,
                               self.context + self.tokens.shape[1], self.mode, self.logits)

    def ms(self, dispatcher, reps: int = 20, trials: int = 3) -> float:
        """Median over `trials` of the mean ms per step over `reps` back-to-back replays under
        `dispatcher` (captured on first use; the active dispatcher is restored afterwards)."""
        before = get_dispatcher()
        set_dispatcher(dispatcher)
        try:
            for _ in range(3):  # capture (first call) and warm replays
                self._step()
            out = []
            for _ in range(trials):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(reps):
                    self._step()
                e1.record()
                e1.synchronize()
                out.append(e0.elapsed_time(e1) / reps)
            return statistics.median(out)
        finally:
            set_dispatcher(before)
