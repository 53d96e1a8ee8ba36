"""Double-quantization detector (GEARBX paper 6.4 / 13.3)."""

import warnings

import pytest
import torch

from gearshift.quant.detect import (DoubleQuantizationWarning, looks_prequantized, prequant_report,
                                    warn_if_prequantized)
from gearshift.quant.int4 import quantize_int4
from gearshift.quant.rowwise import quantize_rowwise


def _w(k=4096, n=64, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [1024, 4096])
def test_random_weight_not_flagged(dtype, k):
    w = _w(k).to(dtype)
    rep = prequant_report(w)
    assert not rep.flagged
    # the margins the thresholds rely on: bf16 rows of 1024 still hold far more than 256 values
    assert rep.row_unique_median > 600
    assert rep.block_unique_median >= 30


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dequantized_rowwise_int4_flagged(dtype):
    w = quantize_rowwise(_w(), 4).dequantize(dtype)
    rep = prequant_report(w)
    assert rep.flagged and rep.row_unique_median <= 15
    assert looks_prequantized(w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dequantized_groupwise_int4_flagged_by_blocks(dtype):
    # g128 over K = 4096: up to 512 values per row (the row test alone would miss it)
    w = quantize_int4(_w(), group_size=128).dequantize(dtype)
    rep = prequant_report(w)
    assert rep.row_unique_median > 256
    assert rep.flagged and rep.block_unique_median <= 16


def test_dequantized_rowwise_int8_flagged():
    assert looks_prequantized(quantize_rowwise(_w(), 8).dequantize(torch.float16))


def test_short_rows_and_tiny_weights():
    # rows < 1024: the row test is not applied; the block test still is (K >= 128)
    w = _w(k=256)
    rep = prequant_report(w)
    assert rep.row_unique_median is None and not rep.flagged
    assert looks_prequantized(quantize_rowwise(w, 4).dequantize())
    # too short for either test: never flagged
    assert not looks_prequantized(torch.zeros(4, 64))
    assert not looks_prequantized(torch.zeros(0, 64))


def test_warning_helper():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert warn_if_prequantized(quantize_rowwise(_w(), 4).dequantize(), name="layers.0.q_proj")
        assert not warn_if_prequantized(_w(), name="layers.0.k_proj")
    assert len(rec) == 1 and issubclass(rec[0].category, DoubleQuantizationWarning)
    assert "layers.0.q_proj" in str(rec[0].message)
