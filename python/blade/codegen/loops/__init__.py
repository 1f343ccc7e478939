"""Rewrites of bufferized loop nests: math approximations, loop order, parallel tasks on
PyTorch's thread pool, tiled transposes and unit loops."""
