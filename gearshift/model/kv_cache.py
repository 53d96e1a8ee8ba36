"""A preallocated KV cache shared by every precision mode.

One row ("slot") per sequence, each with its own length. Writes go to explicit positions, so
the same call appends (start = length), overwrites a range (QSPEC's verify pass rewrites the
draft entries with W4A16's K/V) and, with `truncate`, drops rejected draft tokens. One extra
scratch position per slot absorbs the writes of padding tokens so they never touch real data.
"""

from __future__ import annotations

import torch

from gearshift.errors import GearshiftError
from gearshift.kernels.kv_write import kv_write_reference, kv_write_triton
from gearshift.kernels.rope_kv_write import rope_kv_write_triton
from gearshift.kernels.switches import fused_for


class KVCache:
    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.capacity = int(capacity)
        self.batch = int(batch)
        shape = (n_layers, batch, n_kv_heads, capacity + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        #: host copy of each slot's length (no device sync needed to read it)
        self.lengths: list[int] = [0] * batch

    @classmethod
    def for_model(cls, config, batch: int, capacity: int, dtype, device) -> "KVCache":
        return cls(config.num_hidden_layers, batch, config.num_key_value_heads, config.head_dim, capacity,
                   dtype, device)

    def slots(self, first: int, count: int) -> "KVCache":
        """Slots first .. first + count - 1 as a cache of their own: the same storage (writes land in
        this cache), a copy of their lengths (the caller copies them back). Prefilling a sequence that
        joins a running batch then computes its own rows only, not the whole batch's."""
        if not (0 <= first and count >= 1 and first + count <= self.batch):
            raise ValueError(f"slots {first}..{first + count - 1} are not in a cache of {self.batch}")
        v = KVCache.__new__(KVCache)
        v.capacity, v.batch = self.capacity, count
        v.k, v.v = self.k[:, first:first + count], self.v[:, first:first + count]
        v.lengths = self.lengths[first:first + count]
        v._root = self.root
        return v

    _root: "KVCache | None" = None  # set on views only (a cache naming itself would be a reference cycle)

    @property
    def root(self) -> "KVCache":
        """The cache whose storage this one is: itself, or the cache `slots` took a view of."""
        return self._root or self

    def like(self, batch: int) -> "KVCache":
        """An empty cache of `batch` slots, laid out as this one (layers, heads, capacity, dtype, device)."""
        n_layers, _, heads, _, dim = self.k.shape
        return KVCache(n_layers, batch, heads, dim, self.capacity, self.k.dtype, self.k.device)

    def copy_positions(self, other: "KVCache", start: list[int], stop: list[int]) -> None:
        """Copy positions start[b] .. stop[b] - 1 of each slot b from `other` (a cache of the same layout)
        into this one. Nothing else is touched: a slot's other positions keep what they hold."""
        for b, (a, z) in enumerate(zip(start, stop)):
            if z > a:
                self.k[:, b, :, a:z].copy_(other.k[:, b, :, a:z])
                self.v[:, b, :, a:z].copy_(other.v[:, b, :, a:z])

    @property
    def scratch(self) -> int:
        return self.capacity

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def check_room(self, start: list[int], n_new: list[int]) -> None:
        for b, (s, n) in enumerate(zip(start, n_new)):
            if n and s + n > self.capacity:
                raise GearshiftError(
                    f"sequence in slot {b} needs {s + n} positions but the KV cache holds {self.capacity}")

    def targets(self, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Where each token's K/V goes: its position, or the scratch slot for padding ([B, T])."""
        return torch.where(valid, positions, torch.full_like(positions, self.scratch)).contiguous()

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, targets: torch.Tensor) -> None:
        """Store k, v [B, T, H, D] at `targets` [B, T] (from `targets()`, computed once per forward)."""
        if fused_for(k):  # one launch for k and v instead of two index_put_
            kv_write_triton(self.k[layer], self.v[layer], k, v, targets)
        else:
            kv_write_reference(self.k[layer], self.v[layer], k, v, targets)

    def write_rotated(self, layer: int, qkv: torch.Tensor, n_q: int, cos: torch.Tensor, sin: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
        """RoPE q and k of a fused qkv output [B, T, W], store rotated k and v at `targets`, return
        rotated q [B, T, n_q, D]: one launch instead of three (GPU with the fused kernels only)."""
        return rope_kv_write_triton(qkv, n_q, self.k.shape[2], cos, sin, self.k[layer], self.v[layer], targets)

    def view(self, layer: int, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :, :, :upto], self.v[layer, :, :, :upto]

    def commit(self, start: list[int], n_new: list[int]) -> None:
        for b, (s, n) in enumerate(zip(start, n_new)):
            if n:
                self.lengths[b] = s + n

    def truncate(self, slot: int, length: int) -> None:
        """Forget everything at and after `length` in a slot (rejected draft tokens)."""
        if length > self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0
