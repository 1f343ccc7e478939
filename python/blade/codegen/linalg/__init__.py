"""StableHLO ops that Blade lowers to linalg itself: window reductions, gathers and
concatenations."""
