"""The LLVM-dialect module to object code, on worker processes."""
