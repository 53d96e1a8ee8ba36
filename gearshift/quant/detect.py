"""Double-quantization detector (GEARBX paper 6.4 and 13.3).

A weight that was quantized once and expanded back to fp16/bf16 (a GPTQ/AWQ/GGUF model
"de-quantized" for export, an fp8 checkpoint upcast, ...) takes only a few distinct values per
row or per group.  Re-quantizing it compounds the two errors (paper 13.3), most of all in the
int4 low gear, so the precision manager warns before it builds the low gear from such a source.

Two unique-value tests on a few sampled rows (sampling keeps the check O(rows * K) and cheap):

1. **Per row** (rows of at least ``min_row_len`` = 1024 values): flagged when the median
   sampled row has at most ``max_row_unique`` = 256 distinct values.  256 is the most any
   8-bit code can produce with one scale per row or per tensor (int8: 255 levels, uint8
   asymmetric / fp8: at most 256 codes); a continuous weight row of >= 1024 values in fp16 has
   ~K distinct values and even bf16 (8 mantissa bits) has several hundred (measured: ~690 for
   K = 1024 of N(0, 0.02), see tests), so 256 separates the two with a wide margin.  Rows
   shorter than 1024 are not judged by this test: too few samples to tell a coarse dtype from a
   code book.
2. **Per block** (rows of at least ``4 * block`` values): the row is cut into aligned blocks
   of ``block`` = 32 values; flagged when the median block has at most ``max_block_unique`` =
   16 distinct values.  Group-wise formats have 16 levels per group for 4 bits (GPTQ/AWQ g128,
   MLX g64, GGUF Q4 g32: group sizes are multiples of 32, so an aligned 32-block lies inside
   one group), whereas 32 continuous values are almost all distinct (~31-32 in fp16 and bf16).
   Test 1 alone misses these: a g128 int4 row of K = 4096 has up to 16 * 32 = 512 values.

Not detected (documented limitation): group-wise 8-bit (up to 255 levels per group, which a
32-block cannot tell from continuous values).  Re-quantizing an int8 source to int8 or int4
adds little error on top of the int4 gear's own, so this miss matters least.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

#: rows sampled from the weight (evenly spaced, deterministic)
SAMPLE_ROWS = 16
#: test 1: only rows of at least this many values are judged
MIN_ROW_LEN = 1024
#: test 1: at most this many distinct values per row => already quantized (8-bit code books)
MAX_ROW_UNIQUE = 256
#: test 2: aligned block length (a divisor of every common group size: 32, 64, 128)
BLOCK = 32
#: test 2: at most this many distinct values per block => group-wise <= 4-bit source
MAX_BLOCK_UNIQUE = 16


class DoubleQuantizationWarning(UserWarning):
    """The source weight looks already quantized; re-quantizing it compounds the error."""


@dataclass(frozen=True)
class PrequantReport:
    flagged: bool
    reason: str
    rows_sampled: int
    #: median distinct values per sampled row (None when rows are shorter than min_row_len)
    row_unique_median: float | None
    #: median distinct values per aligned block (None when rows are shorter than 4 blocks)
    block_unique_median: float | None


def _distinct_counts(x: torch.Tensor) -> torch.Tensor:
    """Distinct values along the last dim of a float tensor (sort-based, vectorised)."""
    s, _ = torch.sort(x, dim=-1)
    return 1 + (s[..., 1:] != s[..., :-1]).sum(-1)


def prequant_report(weight: torch.Tensor, *, sample_rows: int = SAMPLE_ROWS, min_row_len: int = MIN_ROW_LEN,
                    max_row_unique: int = MAX_ROW_UNIQUE, block: int = BLOCK,
                    max_block_unique: int = MAX_BLOCK_UNIQUE) -> PrequantReport:
    """Run both unique-value tests on ``sample_rows`` evenly spaced rows of a [out, in] weight."""
    w = weight.detach()
    if w.dim() == 1:
        w = w.unsqueeze(0)
    w = w.reshape(-1, w.shape[-1])
    n, k = w.shape
    if n == 0 or k == 0:
        return PrequantReport(False, "empty weight", 0, None, None)
    rows = torch.linspace(0, n - 1, steps=min(sample_rows, n)).round().long().unique()
    sample = w[rows.to(w.device)].float()  # exact for fp16 / bf16 / fp32 sources
    row_med = blk_med = None
    reasons = []
    if k >= min_row_len:
        row_med = float(_distinct_counts(sample).float().median())
        if row_med <= max_row_unique:
            reasons.append(f"median {row_med:.0f} distinct values per row of {k} (<= {max_row_unique})")
    if k >= 4 * block:
        nb = k // block
        blocks = sample[:, : nb * block].reshape(sample.shape[0], nb, block)
        blk_med = float(_distinct_counts(blocks).float().median())
        if blk_med <= max_block_unique:
            reasons.append(f"median {blk_med:.0f} distinct values per {block}-value block (<= {max_block_unique})")
    flagged = bool(reasons)
    return PrequantReport(flagged, "; ".join(reasons) if flagged else "looks continuous", int(rows.numel()),
                          row_med, blk_med)


def looks_prequantized(weight: torch.Tensor, **kwargs) -> bool:
    """True when ``weight`` has so few distinct values that it was likely quantized before."""
    return prequant_report(weight, **kwargs).flagged


def warn_if_prequantized(weight: torch.Tensor, name: str = "weight", **kwargs) -> bool:
    """Emit a :class:`DoubleQuantizationWarning` naming ``name`` if it looks quantized; return the flag.

    The paper's advice (13.3): avoid the most aggressive (int4 low gear) path when quality is
    critical, since its error adds to the source's own quantization error."""
    report = prequant_report(weight, **kwargs)
    if report.flagged:
        warnings.warn(f"{name} looks already quantized ({report.reason}); re-quantizing it compounds the "
                      "error, most of all in the int4 low gear", DoubleQuantizationWarning, stacklevel=2)
    return report.flagged
