"""What code generation made of one cluster, counted once: the compile cache stores it
with the code, and the report shows it per engine."""
from dataclasses import asdict, dataclass


@dataclass
class CodeStatistics:
    """Counted by the passes that make each thing (see blade.codegen.pipeline).

    Example:
        >>> CodeStatistics(library_calls=2).as_dict()["library_calls"]
        2
    """

    library_calls: int = 0     # ops outlined as RAL kernel calls
    fused_attention: int = 0   # of those, attention chains run as one kernel
    parallel_loops: int = 0    # loop nests run on PyTorch's intra-op threads
    tiled_transposes: int = 0  # transposing loop nests rewritten as vector tiles

    def as_dict(self) -> dict:
        return asdict(self)
