"""`kernels/pad_rows.py`: the Triton pad against its torch reference (CPU under TRITON_INTERPRET=1, or a GPU)."""

import pytest
import torch

from gearshift.kernels._triton import triton_usable
from gearshift.kernels.pad_rows import pad_rows, pad_rows_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.skipif(not triton_usable(torch.empty(1, device=DEV)), reason="needs a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8])
@pytest.mark.parametrize("m, k, rows", [(33, 1100, 64), (1, 64, 8), (5, 2048, 5)])
def test_pad_rows_matches_the_reference(m, k, rows, dtype):
    big = (torch.randn(m, k + 8, device=DEV) * 20).to(dtype)
    x = big[:, :k]  # strided rows
    y = pad_rows(x, rows)
    assert y.shape == (rows, k) and y.is_contiguous() and torch.equal(y, pad_rows_reference(x, rows))
    assert not y[m:].any()


def test_pad_rows_refuses_fewer_rows():
    with pytest.raises(ValueError, match="cannot hold"):
        pad_rows(torch.zeros(4, 8), 3)

