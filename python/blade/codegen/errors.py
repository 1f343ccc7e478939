"""The error every code generation step raises: what failed, and the cluster node to blame
when MLIR's diagnostics locate it."""
import re
from typing import Optional, Sequence


class CodegenError(Exception):
    """A compilation stage failed; the message names the stage and MLIR's diagnostics.
    `node_index` is the index in the cluster of the node whose ops failed, when MLIR's
    diagnostics locate the failure (see node_location), else None; `summary` is
    one line saying what failed."""

    def __init__(self, message: str, node_index: Optional[int] = None,
                 summary: Optional[str] = None):
        super().__init__(message)
        self.node_index = node_index
        self.summary = summary or message.splitlines()[0]

    @classmethod
    def from_mlir(cls, what: str, error: Exception) -> "CodegenError":
        """`what` failed with `error`, an MLIRError whose diagnostics (with their locations)
        say why and where."""
        diagnostics = list(getattr(error, "error_diagnostics", None) or ())
        locations = []
        for diagnostic in diagnostics:
            locations.append(str(diagnostic.location))
            locations.extend(str(note.location) for note in diagnostic.notes)
        summary = None
        if diagnostics:
            # The first line, without the op that some messages print after ": %".
            first = str(diagnostics[0].message).splitlines()[0].split(": %")[0]
            summary = f"{what}: {first[:200]}"
        return cls(f"{what}: {error}", failing_node(locations), summary)


def node_location(index: int) -> str:
    """The MLIR location name of the cluster's node `index`: every op written for the node
    carries it, and MLIR's diagnostics name it, so a failure deep in the pipeline points
    back at the node (see `failing_node`)."""
    return f"blade_node_{index}"


_NODE_LOCATION = re.compile(r'"blade_node_(\d+)"')


def failing_node(locations: Sequence[str]) -> Optional[int]:
    """The node index in the first of `locations` (MLIR location texts) that names one."""
    for location in locations:
        match = _NODE_LOCATION.search(location)
        if match:
            return int(match.group(1))
    return None
