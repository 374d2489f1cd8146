"""The TFLite interpreter backend: ai-edge-litert, else tflite_runtime.

Coral boards ship tflite_runtime (numpy<2); everywhere else ai-edge-litert is
the maintained package. Both expose the same ``Interpreter`` and
``load_delegate``; this module picks one once and hides which.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

try:  # The maintained successor of tflite_runtime; the default.
    from ai_edge_litert import interpreter as _tfl

    BACKEND = "ai-edge-litert"
except ImportError:  # pragma: no cover - exercised on Coral boards
    try:
        from tflite_runtime import interpreter as _tfl  # type: ignore[no-redef]

        BACKEND = "tflite_runtime"
    except ImportError:
        _tfl = None
        BACKEND = None


def backend_version() -> Optional[str]:
    """Returns the installed interpreter package's version, or None."""
    if BACKEND is None:
        return None
    from importlib import metadata

    name = "ai-edge-litert" if BACKEND == "ai-edge-litert" else "tflite-runtime"
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # pragma: no cover
        return None


_STDERR_LOCK = threading.Lock()
# TFLite logs this on every interpreter it creates; it is noise to a user and
# would break the CLI's promise of one line per error.
_NOISE = ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",)


@contextlib.contextmanager
def _filtered_native_stderr() -> Iterator[None]:
    """Captures what native code writes to fd 2 and passes on all but known noise."""
    with _STDERR_LOCK, tempfile.TemporaryFile() as capture:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines():
                if line.strip() and line.strip() not in _NOISE:
                    print(line, file=sys.stderr)


def _require_backend() -> Any:
    if _tfl is None:
        raise ImportError(
            "no TFLite interpreter installed: pip install ai-edge-litert "
            "(or tflite-runtime on a Coral board)"
        )
    return _tfl


def make_cpu_interpreter(
    model: "str | os.PathLike[str] | bytes", num_threads: int = 1
) -> Any:
    """Creates a CPU interpreter (XNNPACK where the backend applies it) and allocates tensors.

    Args:
      model: Path to a .tflite file, or the model's bytes.
      num_threads: Threads the interpreter's kernels may use.

    Returns:
      An allocated ``Interpreter``.

    Raises:
      ValueError: If the file is not a valid TFLite model.
      ImportError: If no interpreter package is installed.
    """
    tfl = _require_backend()
    with _filtered_native_stderr():
        if isinstance(model, (bytes, bytearray)):
            interp = tfl.Interpreter(model_content=bytes(model), num_threads=num_threads)
        else:
            interp = tfl.Interpreter(model_path=os.fspath(model), num_threads=num_threads)
        interp.allocate_tensors()
    return interp


def load_delegate(library: str, options: Optional[dict] = None) -> Any:
    """Loads a TFLite external delegate (libedgetpu) through the active backend.

    Args:
      library: Shared library name, e.g. ``libedgetpu.so.1``.
      options: Delegate options, e.g. ``{'device': 'usb:0'}``.

    Returns:
      The delegate object.

    Raises:
      ValueError: If the library cannot be loaded.
    """
    return _require_backend().load_delegate(library, options or {})


def make_delegate_interpreter(model: "str | os.PathLike[str]", delegates: List[Any]) -> Any:
    """Creates an interpreter that runs ``model`` on the given delegates and allocates tensors."""
    interp = _require_backend().Interpreter(
        model_path=os.fspath(model), experimental_delegates=delegates
    )
    interp.allocate_tensors()
    return interp


class TensorIO:
    """Runs an allocated interpreter by tensor name: set inputs, invoke, get outputs.

    Names are resolved to tensor indices once, here; each call then costs a
    ``set_tensor`` per input, the invoke and a ``get_tensor`` per output. The
    segment runners and the RNN step models share this core.

    Args:
      interp: The allocated interpreter; owned by the thread that calls this.
      inputs: ``(name, tensor index)`` of the inputs, in any order.
      outputs: ``(name, tensor index)`` of the outputs to return.
    """

    def __init__(self, interp: Any, inputs: Sequence[Tuple[str, int]],
                 outputs: Sequence[Tuple[str, int]]) -> None:
        self.interpreter = interp
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._set, self._invoke, self._get = interp.set_tensor, interp.invoke, interp.get_tensor

    @classmethod
    def from_details(cls, interp: Any) -> "TensorIO":
        """Binds every input and output of ``interp`` by its tensor name."""
        return cls(interp, [(d["name"], d["index"]) for d in interp.get_input_details()],
                   [(d["name"], d["index"]) for d in interp.get_output_details()])

    @classmethod
    def from_signature(cls, interp: Any, key: str = "serving_default") -> "TensorIO":
        """Binds ``interp``'s inputs and outputs by their names in signature ``key``.

        Raises:
          ValueError: If the model has no such signature.
        """
        runner = interp.get_signature_runner(key)
        return cls(interp, [(k, d["index"]) for k, d in runner.get_input_details().items()],
                   [(k, d["index"]) for k, d in runner.get_output_details().items()])

    @property
    def input_names(self) -> List[str]:
        """The names of the bound inputs."""
        return [name for name, _ in self._inputs]

    def __call__(self, tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        for name, index in self._inputs:
            self._set(index, tensors[name])
        self._invoke()
        return {name: self._get(index) for name, index in self._outputs}
