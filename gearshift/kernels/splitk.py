"""Deterministic split-K in one launch: partials to a workspace, the last program sums them.

Each (n-tile, k-slice) program stores its fp32 partial row block to `ws[slice, n]`, then
increments the n-tile's arrival counter. The program that arrives last reads the S partials in
slice order (fixed order: the result is bit-reproducible run to run, unlike fp32 atomics), writes
the output in its dtype and resets the counter to 0, so the counters stay zero between launches
and need no memset launch. Launches on one stream run one after another, so consecutive kernels
share one counter buffer per device; kernels on concurrent streams would not (not used here).
"""

from __future__ import annotations

import torch

from gearshift.kernels._triton import HAS_TRITON, tl, triton

_WORDS: dict[tuple[str, str, int | None], torch.Tensor] = {}
MAX_TILES = 1 << 16


_OUTGROWN: list[torch.Tensor] = []  # never freed: CUDA graphs captured with them keep using them


def zeroed_words(name: str, device: torch.device, n: int) -> torch.Tensor:
    """The device's buffer `name` of at least n zeroed int32 words, allocated once: for kernels that
    count arrivals in it and leave it at zero (no memset launch). A larger request allocates a
    buffer twice as large and keeps the old one alive: graphs captured before still point at it
    (freeing it let a replay count in memory that other tensors had taken over)."""
    key = (name, device.type, device.index)
    c = _WORDS.get(key)
    if c is None or c.numel() < n:
        if c is not None:
            _OUTGROWN.append(c)
        c = torch.zeros(max(n, 2 * c.numel() if c is not None else n), dtype=torch.int32, device=device)
        _WORDS[key] = c
    return c


def counters(device: torch.device, n_tiles: int) -> torch.Tensor:
    """The device's zeroed arrival counters (allocated once; kernels leave them at zero)."""
    if n_tiles > MAX_TILES:
        raise ValueError(f"split-K reduction supports at most {MAX_TILES} output tiles, got {n_tiles}")
    return zeroed_words("splitk", device, MAX_TILES)


def splitk_buffers(y: torch.Tensor, split_k: int, n_out: int, n_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(workspace [split_k, n_out] fp32, arrival counters) for a launch writing y; with no split,
    both are unused and y stands in for them (Triton still wants a pointer)."""
    if split_k == 1:
        return y, y
    return (torch.empty((split_k, n_out), device=y.device, dtype=torch.float32), counters(y.device, n_tiles))


if HAS_TRITON:

    @triton.jit
    def splitk_finish(acc, y_ptrs, ws_ptr, cnt_ptr, offs, mask, pid_t, pid_k, n_out, SPLIT_K: tl.constexpr,
                      TAIL: tl.constexpr = 0):
        """acc: this program's fp32 partial for output elements `offs` (flat index into one [M*N]
        slice of ws); y_ptrs/mask address the same elements of the output. TAIL (timing
        experiments only, wrong results; benchmarks/mma_ablations/splitk_tail.py): 1 stores the
        partial and stops, 2 also takes the arrival ticket but never sums."""
        if SPLIT_K == 1:
            tl.store(y_ptrs, acc.to(y_ptrs.dtype.element_ty), mask=mask)
        elif TAIL == 1:
            tl.store(ws_ptr + pid_k * n_out + offs, acc, mask=mask)
        elif TAIL == 2:
            tl.store(ws_ptr + pid_k * n_out + offs, acc, mask=mask)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + pid_t, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                tl.atomic_xchg(cnt_ptr + pid_t, 0, sem="relaxed", scope="gpu")
        else:
            tl.store(ws_ptr + pid_k * n_out + offs, acc, mask=mask)
            tl.debug_barrier()  # every thread's partial is written before the counter moves
            arrived = tl.atomic_add(cnt_ptr + pid_t, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                tot = tl.zeros_like(acc)
                for s in tl.static_range(SPLIT_K):
                    tot += tl.load(ws_ptr + s * n_out + offs, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(y_ptrs, tot.to(y_ptrs.dtype.element_ty), mask=mask)
                tl.atomic_xchg(cnt_ptr + pid_t, 0, sem="relaxed", scope="gpu")
