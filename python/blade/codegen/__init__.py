"""From a cluster's torch-dialect function to native code. `driver` runs the stages; the
subpackages hold Blade's own rewrites, one folder per IR level: `stablehlo`, `kernels`
(library calls into the runtime), `linalg`, `loops` and `llvm` (object code and its ABI)."""
