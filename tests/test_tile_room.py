"""`kernels/tile_room.py`: buffers of whole token tiles, and the rows past an input that the wgmma kernels read."""

import pytest
import torch

from gearshift.kernels import switches
from gearshift.kernels import tile_room as PR
from gearshift.kernels._triton import triton_usable
from gearshift.kernels.tile_room import empty_rows, room_rows


def test_rows_in_storage_views_the_rows_the_storage_holds_past_x():
    """A producer's buffer of whole token tiles: its rows past x are viewed, not copied (with x's row stride); a
    buffer that ends before the rows, or strided columns, give None."""
    buf = torch.full((64, 16), float("nan"))
    buf[:33] = torch.randn(33, 16)
    x = buf[:33]
    v = PR.rows_in_storage(x, 64)
    assert v.shape == (64, 16) and v.data_ptr() == x.data_ptr() and torch.equal(v[:33], x) and v[33:].isnan().all()
    assert PR.rows_in_storage(x, 65) is None  # past the storage's end
    assert PR.rows_in_storage(torch.randn(33, 16), 64) is None
    narrow = PR.rows_in_storage(buf[:33, :8], 64)  # rows of a wider buffer: the same row stride
    assert narrow.shape == (64, 8) and narrow.stride() == (16, 1) and narrow.data_ptr() == buf.data_ptr()
    assert PR.rows_in_storage(buf.t()[:, :33], 20) is None  # strided columns
    offset = buf[10:43]  # a view that starts inside the storage: room is counted from its own offset
    assert PR.rows_in_storage(offset, 54).shape == (54, 16) and PR.rows_in_storage(offset, 55) is None


def test_whole_tiles_takes_the_room_then_copies_only_where_asked(monkeypatch):
    room = torch.randn(256, 8)
    assert PR.whole_tiles(room[:129], 128, copy=False).data_ptr() == room.data_ptr()  # free: taken without `copy`
    tight = torch.randn(129, 8)
    assert PR.whole_tiles(tight, 128, copy=False) is tight
    padded = PR.whole_tiles(tight, 128, copy=True)
    assert padded.shape == (256, 8) and torch.equal(padded[:129], tight) and not padded[129:].any()
    assert PR.whole_tiles(tight[:128], 128, copy=True).shape == (128, 8)
    monkeypatch.setitem(switches._FUSED, "tile_room", False)
    assert PR.whole_tiles(room[:129], 128, copy=False).shape == (129, 8)


def test_room_rows_are_whole_tiles_no_taller_than_the_bucket():
    assert [room_rows(m) for m in (1, 16, 17, 32, 33, 65, 100, 129, 256, 257, 700)] == \
        [1, 16, 32, 32, 64, 128, 128, 256, 256, 512, 768]


def test_empty_rows_sit_at_the_start_of_the_buffer():
    y = empty_rows(129, 8, torch.bfloat16, "cpu")
    assert y.shape == (129, 8) and y.is_contiguous() and y.untyped_storage().nbytes() == 256 * 8 * 2
    assert PR.rows_in_storage(y, 256) is not None
    assert empty_rows(16, 8, torch.int8, "cpu").untyped_storage().nbytes() == 16 * 8


@pytest.mark.skipif(not triton_usable(torch.empty(1)), reason="needs TRITON_INTERPRET=1 (the Triton producers)")
def test_the_linears_producers_leave_room():
    """The RMSNorms, SwiGLU and the activation quantizer write their rows at the start of a buffer of whole tiles."""
    from gearshift.kernels.act_quant import quantize_act_triton
    from gearshift.kernels.rmsnorm import rms_norm_codes_triton, rms_norm_triton
    from gearshift.kernels.silu_mul import silu_mul_triton
    from gearshift.quant.activations import ActQuantSpec

    x = torch.randn(129, 64)
    w = torch.ones(64)
    room = 256 * 64
    assert rms_norm_triton(x, w, 1e-5).untyped_storage().nbytes() == room * 4
    h, codes = rms_norm_codes_triton(x, w, 1e-5, 127.0)
    assert h.untyped_storage().nbytes() == room * 4 and codes.codes.untyped_storage().nbytes() == room
    assert silu_mul_triton(torch.randn(129, 128)).untyped_storage().nbytes() == room * 4
    q, _ = quantize_act_triton(x, ActQuantSpec("int8"))
    assert q.shape == (129, 64) and q.untyped_storage().nbytes() == room
