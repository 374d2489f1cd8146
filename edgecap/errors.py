"""The errors edgecap raises: bad input (``EdgecapError``: one line, exit code 2 from the CLI) and
failures at run time (``RunFailure``: one line, exit code 1)."""


class EdgecapError(Exception):
    """Bad input a user can fix: the message names the thing and the fix."""


class BundleError(EdgecapError):
    """A model bundle that fails validation."""


class SourceError(EdgecapError):
    """A video source that cannot be opened or read."""


class PlanError(EdgecapError):
    """A plan.json that is missing, malformed or does not match its bundle."""


class ConfigError(EdgecapError):
    """A malformed configuration file or option."""


class PipelineBusy(EdgecapError):
    """A run started on a pipeline (or captioner) while another thread's run is still open."""


class RunCancelled(EdgecapError):
    """A run stopped before its end by ``close()`` or ``cancel()``, from another thread or a signal handler."""


class DeviceFailed(EdgecapError):
    """A device stopped working mid-run: its invoke raised, hung past its deadline,
    crashed its worker process, or the device left the bus.

    Attributes:
      device: The device string, e.g. ``tpu:0`` or ``emu-tpu:1``.
      kind: ``error``, ``hung``, ``crashed`` or ``vanished``.
    """

    def __init__(self, device: str, kind: str, detail: str) -> None:
        super().__init__(f"{device}: {kind}: {detail}")
        self.device = device
        self.kind = kind


class RunFailure(Exception):
    """A failure at run time that no input caused: the CLI reports one line and exits 1."""


class StageFailed(RunFailure):
    """A pipeline step on the CPU (a CNN stage, the RNN step, the decoder) raised mid-run.

    An EdgeTPU stage's error is a ``DeviceFailed`` instead, which the
    captioner fails over from; a CPU step's has nowhere to go.

    Attributes:
      step: The step's name, e.g. ``rnn_step`` or ``stage 1 (cpu)``.
      worker: The worker that ran it, e.g. ``cpu``.
    """

    def __init__(self, step: str, worker: str, error: BaseException) -> None:
        super().__init__(f"{step} on {worker} failed at run time: {type(error).__name__}: {error}")
        self.step = step
        self.worker = worker
