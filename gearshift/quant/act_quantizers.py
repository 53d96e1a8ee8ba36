"""Calibrated activation quantizers for the low-precision draft modes (W4A4, W4A8).

Plain per-token 4-bit activations are useless as a QSPEC draft (SmolLM2-135M: 7 % top-1
agreement with W4A16). The two W4A4 recipes the QSPEC paper builds on fix that without
touching the shared int4 weights:

* **Atom** (`OutlierActQuantizer`, kind ``"outlier"``): a few input channels carry most of the
  activation energy. They are chosen offline from calibration activations, kept at 8 bits, and
  the remaining channels get 4-bit scales per token and per group of `group_size` channels.
* **QuaRot** (`HadamardActQuantizer`, kind ``"hadamard"``): an orthogonal (randomised
  Hadamard) rotation R spreads outliers over all channels before quantization. We apply it
  *online* on both sides, Q(x R) R^T, so the weights stay exactly as stored.

Both are `nn.Module`s (their index / sign tensors move with the model), are registered in
`ACT_QUANTIZERS` (checkpoints save them with `to_state` and rebuild them with `from_state`) and
implement the reference semantics `fake_quantize(x)`: the dequantized activations an A4/A8
kernel would multiply with dequant(W). The int4 weight store is never read or written here, so
W4A16 (which ignores activation quantizers) is bit-identical before and after calibration.

How a kernel uses the outlier layout (recorded in the state as `perm`, outliers last):

    x_p = x[..., perm]              # once per call; normal channels first, outliers contiguous at the end
    normal = x_p[..., :K - n]       # 4-bit codes, one scale per token and group of `group_size`
    outl   = x_p[..., K - n:]       # 8-bit codes, one scale per token and group of `outlier_group_size`
    y = normal_q @ W[:, perm[:K-n]].T  +  outl_q @ W[:, perm[K-n:]].T

The weight columns are never physically moved in the shared store (that would break its
groups of 32 along K, and change nothing for W4A16): a kernel either gathers the columns with
`perm` while loading tiles, or builds at load time a reordered copy of the packed codes plus a
per-column group-index map `g_idx[j] = perm[j] // weight_group_size` (GPTQ act-order style), so
every column keeps its original (scale, min). Both give exactly the sum above.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import nn

from gearshift.quant.activations import register_act_quantizer

_INT_QMAX = {4: 7.0, 8: 127.0}


def fake_quantize_groups(x: torch.Tensor, bits: int, group_size: int | None, clip: float = 1.0) -> torch.Tensor:
    """Symmetric round-to-nearest per token and per group of `group_size` channels (None: whole row).

    The scale is clip * absmax / qmax; values beyond it saturate. Returns dequantized fp32.
    """
    if bits not in _INT_QMAX:
        raise ValueError(f"activation bits must be 4 or 8, got {bits}")
    k = x.shape[-1]
    if k == 0:
        return x.float()
    g = k if group_size is None else int(group_size)
    if k % g:
        raise ValueError(f"activation width {k} is not a multiple of group size {g}")
    qmax = _INT_QMAX[bits]
    xg = x.float().reshape(*x.shape[:-1], k // g, g)
    scale = (xg.abs().amax(-1, keepdim=True) * clip / qmax).clamp_min(1e-8)
    q = torch.clamp(torch.round(xg / scale), -qmax, qmax)
    return (q * scale).reshape(x.shape)


# ---------------------------------------------------------------------------------- Atom outliers

@register_act_quantizer
class OutlierActQuantizer(nn.Module):
    """Atom-style mixed precision: `outlier_idx` channels at `outlier_bits`, the rest at `bits`.

    With no outliers this is plain group-wise quantization (plus optional clipping).
    """

    kind = "outlier"

    def __init__(self, in_features: int, outlier_idx: torch.Tensor | list[int] | None = None, bits: int = 4,
                 group_size: int | None = None, outlier_bits: int = 8, clip: float = 1.0,
                 outlier_group_size: int | None = None):
        super().__init__()
        k = int(in_features)
        idx = torch.as_tensor([] if outlier_idx is None else outlier_idx, dtype=torch.long).flatten()
        idx = torch.unique(idx)  # sorted, no duplicates
        n = idx.numel()
        if n and (idx.min() < 0 or idx.max() >= k):
            raise ValueError(f"outlier channel indices must lie in 0..{k - 1}")
        if n >= k:
            raise ValueError(f"{n} outlier channels leave no normal channel out of {k}")
        if group_size is not None and (k - n) % group_size:
            raise ValueError(f"{k - n} normal channels ({k} - {n} outliers) are not a multiple of the "
                             f"activation group size {group_size}; choose a multiple of it as the outlier count")
        if outlier_group_size is None:
            outlier_group_size = group_size if group_size is not None and n and n % group_size == 0 else None
        if outlier_group_size is not None and n % outlier_group_size:
            raise ValueError(f"{n} outliers are not a multiple of the outlier group size {outlier_group_size}")
        if bits not in _INT_QMAX or outlier_bits not in _INT_QMAX:
            raise ValueError("bits and outlier_bits must be 4 or 8")
        if not 0.0 < clip <= 1.0:
            raise ValueError(f"clip ratio must be in (0, 1], got {clip}")
        self.in_features = k
        self.bits, self.outlier_bits = int(bits), int(outlier_bits)
        self.group_size = None if group_size is None else int(group_size)
        self.outlier_group_size = None if outlier_group_size is None else int(outlier_group_size)
        self.clip = float(clip)
        is_out = torch.zeros(k, dtype=torch.bool)
        is_out[idx] = True
        perm = torch.cat([torch.arange(k)[~is_out], idx])  # normal channels in order, outliers last
        self.register_buffer("outlier_idx", idx)
        self.register_buffer("perm", perm)
        self.register_buffer("inv_perm", torch.argsort(perm), persistent=False)

    @property
    def n_outliers(self) -> int:
        return int(self.outlier_idx.numel())

    def fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        n = self.n_outliers
        if n == 0:
            return fake_quantize_groups(x, self.bits, self.group_size, self.clip).to(x.dtype)
        xp = x.float().index_select(-1, self.perm)
        k = self.in_features
        normal = fake_quantize_groups(xp[..., :k - n], self.bits, self.group_size, self.clip)
        outl = fake_quantize_groups(xp[..., k - n:], self.outlier_bits, self.outlier_group_size, 1.0)
        return torch.cat([normal, outl], -1).index_select(-1, self.inv_perm).to(x.dtype)

    def to_state(self) -> tuple[dict, dict]:
        meta = {"in_features": self.in_features, "bits": self.bits, "group_size": self.group_size,
                "outlier_bits": self.outlier_bits, "outlier_group_size": self.outlier_group_size,
                "n_outliers": self.n_outliers, "clip": self.clip, "layout": "perm: normal channels, then outliers"}
        return meta, {"outlier_idx": self.outlier_idx.detach().cpu(), "perm": self.perm.detach().cpu()}

    @classmethod
    def from_state(cls, meta: dict, tensors: dict) -> "OutlierActQuantizer":
        q = cls(int(meta["in_features"]), tensors.get("outlier_idx"), int(meta.get("bits", 4)),
                meta.get("group_size"), int(meta.get("outlier_bits", 8)), float(meta.get("clip", 1.0)),
                meta.get("outlier_group_size"))
        if "perm" in tensors and not torch.equal(tensors["perm"].long().cpu(), q.perm):
            raise ValueError("saved outlier permutation disagrees with the outlier indices")
        return q

    def extra_repr(self) -> str:
        g = "token" if self.group_size is None else f"g{self.group_size}"
        return (f"K={self.in_features}, a{self.bits}/{g}, {self.n_outliers} outliers at a{self.outlier_bits}"
                + (f", clip {self.clip}" if self.clip != 1.0 else ""))


# ---------------------------------------------------------------------------------- Hadamard

def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, int(math.isqrt(n)) + 1))


def _paley(n: int) -> torch.Tensor:
    """Paley construction I: a Hadamard matrix of order n = q + 1, q prime, q = 3 mod 4."""
    q = n - 1
    residues = {(i * i) % q for i in range(1, q)}
    chi = [0] + [1 if a in residues else -1 for a in range(1, q)]
    jac = torch.tensor([[chi[(j - i) % q] for j in range(q)] for i in range(q)], dtype=torch.float64)
    s = torch.zeros(n, n, dtype=torch.float64)
    s[0, 1:] = 1.0
    s[1:, 0] = -1.0
    s[1:, 1:] = jac
    return torch.eye(n, dtype=torch.float64) + s


@lru_cache(maxsize=None)
def _hadamard_cached(n: int) -> torch.Tensor | None:
    if n == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    if n % 4 == 0 and _is_prime(n - 1) and (n - 1) % 4 == 3:
        return _paley(n)
    if n % 2 == 0:
        h = _hadamard_cached(n // 2)
        if h is not None:  # Sylvester doubling [[H, H], [H, -H]]
            return torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return None


def hadamard_matrix(n: int) -> torch.Tensor | None:
    """An unnormalised n x n Hadamard matrix (entries +-1, H H^T = n I), or None if not built here.

    Built from Sylvester doubling over Paley-I cores (orders 1, 4, 8, 12, 20, 24, 32, 44, 48,
    60, 72, ...; q + 1 for a prime q = 3 mod 4): covers every power of two and, e.g., 576 = 8 * 72 and 1536 = 32 * 48.
    """
    h = _hadamard_cached(int(n))
    return None if h is None else h.clone()


def hadamard_block_size(k: int, wanted: int | None = None) -> int:
    """The rotation block: `wanted` if given, else the largest Hadamard order dividing k."""
    if wanted is not None:
        if k % wanted or _hadamard_cached(wanted) is None:
            raise ValueError(f"no Hadamard block of order {wanted} for width {k}")
        return wanted
    for b in range(k, 0, -1):
        if k % b == 0 and _hadamard_cached(b) is not None:
            return b
    return 1


def rotation_matrix(k: int, block: int, signs: torch.Tensor) -> torch.Tensor:
    """R = diag(signs) . blockdiag(H_b / sqrt(b)): orthogonal, R R^T = I (fp32)."""
    h = _hadamard_cached(block) / math.sqrt(block)
    r = torch.block_diag(*([h] * (k // block))) if k != block else h
    return (signs.double().unsqueeze(1) * r).float()


@register_act_quantizer
class HadamardActQuantizer(nn.Module):
    """QuaRot-style online rotation: fake_quantize(x) = Q(x R) R^T with R a randomised Hadamard.

    Because (x R)(W R)^T = x W^T for orthogonal R, quantizing in the rotated basis and rotating
    back gives a W4A4 forward over the *unchanged* weights. The price: the GEMM input R^T-rotated
    back is no longer low-precision, so this variant measures quality, not speed. A fast W4A4
    kernel needs W R stored (offline rotation), which changes the int4 weights and therefore the
    W4A16 model; see docs/w4a4.md.
    """

    kind = "hadamard"

    def __init__(self, in_features: int, bits: int = 4, group_size: int | None = None, clip: float = 1.0,
                 block: int | None = None, signs: torch.Tensor | None = None, seed: int = 0):
        super().__init__()
        k = int(in_features)
        if bits not in _INT_QMAX:
            raise ValueError("bits must be 4 or 8")
        if group_size is not None and k % group_size:
            raise ValueError(f"width {k} is not a multiple of the activation group size {group_size}")
        self.in_features, self.bits, self.clip = k, int(bits), float(clip)
        self.group_size = None if group_size is None else int(group_size)
        self.block = hadamard_block_size(k, block)
        self.seed = int(seed)
        if signs is None:
            g = torch.Generator().manual_seed(self.seed)
            signs = torch.randint(0, 2, (k,), generator=g).float() * 2 - 1
        signs = torch.as_tensor(signs, dtype=torch.float32).flatten()
        if signs.numel() != k or not bool(((signs == 1) | (signs == -1)).all()):
            raise ValueError("signs must be k values of +-1")
        self.register_buffer("signs", signs)
        self.register_buffer("rotation", rotation_matrix(k, self.block, signs), persistent=False)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self.rotation

    def unrotate(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self.rotation.T

    def fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        xr = fake_quantize_groups(self.rotate(x), self.bits, self.group_size, self.clip)
        return self.unrotate(xr).to(x.dtype)

    def to_state(self) -> tuple[dict, dict]:
        meta = {"in_features": self.in_features, "bits": self.bits, "group_size": self.group_size,
                "clip": self.clip, "block": self.block, "seed": self.seed, "online": True}
        return meta, {"signs": self.signs.detach().cpu()}

    @classmethod
    def from_state(cls, meta: dict, tensors: dict) -> "HadamardActQuantizer":
        return cls(int(meta["in_features"]), int(meta.get("bits", 4)), meta.get("group_size"),
                   float(meta.get("clip", 1.0)), meta.get("block"), tensors.get("signs"), int(meta.get("seed", 0)))

    def extra_repr(self) -> str:
        g = "token" if self.group_size is None else f"g{self.group_size}"
        return f"K={self.in_features}, online Hadamard block {self.block}, a{self.bits}/{g}"
