"""GEARBX sampling helpers (paper Listing 2, 10.1, table 10): NaN guard, min-p, Gumbel-max.

All functions are batched over the leading dims of [..., V] logits and never synchronise with
the host, so they fit the deferred-entropy step (one device->host copy per token).

* :func:`sanitize_logits`: ``nan_to_num(nan=0, posinf=1e4, neginf=-1e4)`` applied
  unconditionally (checking first would itself need a sync, 10.1).
* :func:`min_p_filter`: keep tokens with ``p_i >= min_p * max_j p_j``; computed on logits as
  ``z_i - max z >= log(min_p)``: no softmax and no O(V log V) sort.
* :func:`gumbel_max_sample`: ``argmax_i(log p_i + G_i)``, ``G_i = -log(-log(U_i + 1e-20))``,
  U ~ Uniform[0, 1) from a ``torch.Generator``.  ``log p_i`` differs from ``z_i / T`` by a
  per-row constant, so the argmax uses the tempered logits directly (same sample, no softmax).
"""

from __future__ import annotations

import math

import torch

#: table 10 NaN guard
NAN_VALUE = 0.0
POSINF_VALUE = 1e4
NEGINF_VALUE = -1e4
#: table 10 Gumbel floor
GUMBEL_FLOOR = 1e-20


def sanitize_logits(logits: torch.Tensor) -> torch.Tensor:
    """NaN -> 0, +inf -> 1e4, -inf -> -1e4 (paper table 10); returns a new tensor."""
    return torch.nan_to_num(logits, nan=NAN_VALUE, posinf=POSINF_VALUE, neginf=NEGINF_VALUE)


def min_p_filter(logits: torch.Tensor, min_p: float | torch.Tensor) -> torch.Tensor:
    """Mask (-inf) every token whose probability is below ``min_p`` times the row's top one.

    ``min_p`` is a float or a per-row tensor [...]; 0 keeps everything, 1 keeps only the
    argmax (and its exact ties).  Apply after temperature scaling if the probabilities meant
    are the tempered ones (as :func:`sample` does)."""
    if isinstance(min_p, (int, float)):
        if min_p <= 0:
            return logits
        log_min_p = math.log(min_p)  # a Python scalar: no host->device copy
    else:
        log_min_p = torch.log(min_p.to(device=logits.device, dtype=torch.float32)).unsqueeze(-1)
    z = logits.float()
    keep = (z - z.amax(-1, keepdim=True)) >= log_min_p
    return logits.masked_fill(~keep, float("-inf"))


def gumbel_noise(shape, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """fp32 Gumbel(0, 1) noise ``-log(-log(U + 1e-20))`` of ``shape``."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    return -torch.log(-torch.log(u + GUMBEL_FLOOR))


def gumbel_max_sample(logits: torch.Tensor, generator: torch.Generator | None = None,
                      temperature: float = 1.0) -> torch.Tensor:
    """One token per row of [..., V] logits, distributed as softmax(logits / temperature).

    ``temperature <= 0`` is greedy argmax.  Returns int64 [...] on the logits' device."""
    if temperature <= 0:
        return logits.argmax(-1)
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    return (z + gumbel_noise(z.shape, generator, z.device)).argmax(-1)


def sample(logits: torch.Tensor, *, temperature: float = 1.0, min_p: float | torch.Tensor = 0.0,
           generator: torch.Generator | None = None, sanitize: bool = True) -> torch.Tensor:
    """Listing 2's sampler: NaN guard, temperature, min-p, Gumbel-max.  [..., V] -> int64 [...]."""
    if sanitize:
        logits = sanitize_logits(logits)
    if temperature <= 0:
        return logits.argmax(-1)
    z = logits.float() / temperature
    z = min_p_filter(z, min_p)
    return gumbel_max_sample(z, generator)
