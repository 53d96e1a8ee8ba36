"""kernels/residency.py: the shared memory that caps CTAs per SM, and the patch of a compiled kernel."""
import types

import pytest

from gearshift.kernels import residency


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8])
def test_shared_bytes_fits_n_ctas_and_not_one_more(n):
    s = residency.shared_bytes(n)
    per_cta = s + residency.RESERVED_PER_CTA
    assert n * per_cta <= residency.SHARED_PER_SM < (n + 1) * per_cta
    assert s <= residency.MAX_SHARED_PER_CTA


def test_shared_bytes_keeps_the_kernels_own_need():
    assert residency.shared_bytes(8, own=60000) == 60000
    with pytest.raises(ValueError):
        residency.shared_bytes(0)


def test_cap_patches_the_launch_metadata_once():
    k = types.SimpleNamespace(name="k", packed_metadata=(8, 1, 1024), function=0)
    residency.cap(k, 5)  # under 48 KB: no driver call
    assert k.packed_metadata == (8, 1, residency.shared_bytes(5))
    residency.cap(k, 5)  # idempotent
    with pytest.raises(ValueError, match="already capped"):
        residency.cap(k, 4)
    odd = types.SimpleNamespace(name="odd", packed_metadata=(8, 1, 0, 0), function=0)
    with pytest.raises(RuntimeError, match="packs launch metadata"):
        residency.cap(odd, 2)
