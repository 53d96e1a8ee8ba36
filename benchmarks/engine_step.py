"""The engine's graphed decode step as a timing target for map searches (GPU).

`e2e_ab.py` times whole generations (prefill, 32 decode steps, host work between them): right for a
verdict, too noisy (2-3% between rounds) to rank tile choices that differ by 1%. This captures the
decode step the engine replays (`GraphRunner`, the model's `forward_tensors`: norms, RoPE + KV write,
decode attention, SwiGLU, the lm_head, PDL as the engine launches them) once per dispatcher and
times back-to-back replays with CUDA events. The attention reads `context` cached keys of random
content (the time does not depend on their values).
"""
from __future__ import annotations

import statistics

import torch


class EngineStep:
    """One decode step of a random-weight model at a batch and context, timed under any dispatcher."""

    def __init__(self, preset: str, mode: str, int4_prog: bool, batch: int, context: int = 512, seed: int = 0,
                 models: dict | None = None):
        from e2e import model_for

        from gearshift.model.cuda_graphs import GraphRunner
        from gearshift.model.kv_cache import KVCache

        self.model = model_for({} if models is None else models, preset, mode, int4_prog)
        cfg = self.model.config
        self.mode, self.context = mode, context
        self.cache = KVCache.for_model(cfg, batch, context + 8, self.model.dtype, "cuda")
        self.cache.k.normal_()
        self.cache.v.normal_()
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.tokens = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda", generator=gen)
        self.start, self.n_new = [context] * batch, [1] * batch
        self.runner = GraphRunner(max_graphs=2)  # each capture holds its pool: keep only the last ones

    def _step(self):
        return self.runner.run(self.model, self.tokens, self.cache, self.start, self.n_new, self.context + 1,
                               self.mode, "last")

    def ms(self, dispatcher, reps: int = 20, trials: int = 3) -> float:
        """Median over `trials` of the mean ms per step over `reps` back-to-back replays."""
        from gearshift.dispatch import get_dispatcher, set_dispatcher

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
