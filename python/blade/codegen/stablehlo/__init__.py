"""Rewrites of the StableHLO function before it becomes linalg: dynamic shape assumptions,
channels-last layouts, slices and splat folding."""
