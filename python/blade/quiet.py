"""TorchScript is deprecated in torch 2.13 and says so on every script, trace and freeze.
Blade uses TorchScript by design, so those notices, and nothing else, are silenced where
Blade calls it: under `-W error::DeprecationWarning` (common in pytest set-ups) they would
otherwise be errors, and under `-W default` noise of Blade's making."""
import contextlib
import warnings


@contextlib.contextmanager
def quiet_torchscript():
    """TorchScript's own deprecation notices, and nothing else, are silenced.

    Example:
        >>> with quiet_torchscript():
        ...     scripted = torch.jit.script(fn)
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated",
                                category=DeprecationWarning)
        yield
