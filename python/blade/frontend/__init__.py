"""From what the user hands `blade.optimize` to one TorchScript graph: exported programs,
the torch.compile backend, decompositions and the dims of the inputs that may vary."""
