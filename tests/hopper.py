"""Test marks shared by the Hopper kernel tests (imported by name: `tests/` is on sys.path under
pytest's default import mode)."""

import pytest
import torch

#: runs only on an sm_90 GPU (wgmma, TMA, setmaxnreg)
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="needs a Hopper GPU")
