"""Ops that run as calls into the runtime's kernels (matmuls, convolutions, attention,
sorts, and aten ops nothing lowers) instead of generated loops: a matcher module per op
family, the outline-library-calls and lower-library-calls passes (outlining.py,
lowering.py), and what they share (library_calls.py)."""
