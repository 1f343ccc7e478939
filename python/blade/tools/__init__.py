"""For people, not the pipeline: the command line, IR dumps and progress, and the bisection
of a cluster whose compiled code disagrees with TorchScript."""
