"""GEMM kernels for every precision mode: Triton on GPU, with the torch reference beside them."""
