"""The read kernels of `benchmarks/mma_ablations/read_depth.py` against their torch references
(TRITON_INTERPRET=1 on CPU, or a GPU): what they time must be every byte of the weights, read once."""
import pytest
import torch

pytest.importorskip("triton")

from bench_scripts import load_script, test_device as _device  # noqa: E402  (tests/bench_scripts.py)


@pytest.fixture(scope="module")
def rd():
    return load_script("mma_ablations/read_depth.py")


def _words(rows, cols, dev):
    return torch.randint(-2 ** 31, 2 ** 31 - 1, (rows, cols), dtype=torch.int32, device=dev)


@pytest.mark.parametrize("warps,u", [(4, 1), (4, 2), (8, 4)])
def test_register_reads_xor_every_word(rd, warps, u):
    w = _words(64, 512, _device())
    chunk = 1 << 14
    out = torch.zeros(1 << 16, dtype=torch.int32, device=w.device)
    rd.regs_read[(w.numel() // chunk,)](w, out, CHUNK=chunk, W=warps, U=u, num_warps=warps)
    ref = rd.regs_reference(w, chunk, warps)
    assert torch.equal(out[:ref.numel()], ref)


@pytest.mark.parametrize("br,bc,ksplit,stages", [(32, 64, 2, 2), (64, 128, 1, 3)])
def test_tma_reads_xor_every_word(rd, br, bc, ksplit, stages):
    from triton.tools.tensor_descriptor import TensorDescriptor
    w = _words(128, 256, _device())
    out = torch.zeros(w.shape[0] * ksplit, dtype=torch.int32, device=w.device)
    desc = TensorDescriptor.from_tensor(w, block_shape=[br, bc])
    rd.tma_read[(w.shape[0] // br, ksplit)](desc, out, w.shape[1], BR=br, BC=bc, KSPLIT=ksplit, STAGES=stages)
    assert torch.equal(out.reshape(-1, ksplit), rd.tma_reference(w, ksplit))


def test_a_missed_word_is_seen(rd):
    """The reference is not blind: flipping one word changes its chunk's XOR."""
    w = _words(64, 512, "cpu")
    ref = rd.regs_reference(w, 1 << 14, 4)
    w[3, 7] ^= 1
    assert not torch.equal(rd.regs_reference(w, 1 << 14, 4), ref)
