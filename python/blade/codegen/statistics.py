"""What code generation made of one cluster, defined once: the passes count it
(blade.codegen.pipeline), the compile cache stores it with the code, and each engine's
report is one (blade.report.ClusterReport)."""
from dataclasses import asdict, dataclass, fields


@dataclass
class CodeStatistics:
    """Counted by the passes that make each thing (see blade.codegen.pipeline).

    Example:
        >>> CodeStatistics(library_calls=2).as_dict()["library_calls"]
        2
    """

    library_calls: int = 0     # ops outlined as RAL kernel calls
    fused_attention: int = 0   # of those, attention chains run as one kernel
    kernel_calls: int = 0      # of those, ops run by PyTorch's dispatcher (kernel calls)
    parallel_loops: int = 0    # loop nests run on PyTorch's intra-op threads
    tiled_transposes: int = 0  # transposing loop nests rewritten as vector tiles

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, counters: dict) -> "CodeStatistics":
        """The counters `as_dict` wrote; raises KeyError or ValueError on a malformed one."""
        return cls(**{f.name: int(counters[f.name]) for f in fields(cls)})

    def take(self, other: "CodeStatistics") -> None:
        """Sets these counters to `other`'s (a report entry taking its code's)."""
        for f in fields(CodeStatistics):
            setattr(self, f.name, getattr(other, f.name))
