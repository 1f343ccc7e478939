"""Built-in converters, one module per op family. Registering is thin (registration.py):
each op's lowering is Torch-MLIR's own torch-to-StableHLO conversion; what lives here is
which overloads are compiled, their dtype rules, and validators for the cases the lowering
cannot take. Importing this package registers them all, and lets the registry ask
Torch-MLIR about ops none of them covers (blade.partition.torch_mlir_probe)."""
from blade.partition import kernel_calls, torch_mlir_probe
from blade.partition.converters import (conv, elementwise, linalg, reduction,  # noqa: F401
                                        scatter, view)
from blade.partition.registry import REGISTRY

REGISTRY.ask_about_unknown_ops(torch_mlir_probe.probe_refusal,
                               torch_mlir_probe.lowering_refusal, torch_mlir_probe.ORIGIN)
REGISTRY.call_kernels_of_unlowered_ops(kernel_calls.schema_refusal, kernel_calls.refusal,
                                       kernel_calls.ORIGIN)
