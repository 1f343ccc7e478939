"""Ops that run as calls into the runtime's kernels (matmuls, convolutions, attention)
instead of generated loops."""
