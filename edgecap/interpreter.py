"""The TFLite interpreter backend: ai-edge-litert, else tflite_runtime.

Coral boards ship tflite_runtime (numpy<2); everywhere else ai-edge-litert is
the maintained package. Both expose the same ``Interpreter`` and
``load_delegate``; this module picks one and hides which.

The rule: ``$EDGECAP_BACKEND`` (``ai-edge-litert`` or ``tflite_runtime``)
forces one for everything. Otherwise CPU stages run on ai-edge-litert when it
is importable, else on tflite_runtime; EdgeTPU stages run on the backend that
``edgecap.edgetpu_runtime.preferred_backend`` picks for the installed
libedgetpu from ``data/edgetpu_compat.json`` when both are importable: with
Coral's own libedgetpu 16.0 (built against TF 2.5, which segfaults under
TFLite newer than 2.11) that is tflite_runtime below 2.12; with a rebuilt
libedgetpu it is ai-edge-litert.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import threading
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

ENV_BACKEND = "EDGECAP_BACKEND"
_MODULES = {"ai-edge-litert": "ai_edge_litert.interpreter", "tflite_runtime": "tflite_runtime.interpreter"}
_DISTRIBUTIONS = {"ai-edge-litert": "ai-edge-litert", "tflite_runtime": "tflite-runtime"}


def _import(backend: str) -> Optional[ModuleType]:
    try:
        return importlib.import_module(_MODULES[backend])
    except ImportError:
        return None


def forced_backend() -> Optional[str]:
    """Returns the backend ``$EDGECAP_BACKEND`` forces, or None.

    Raises:
      ValueError: If it names no known backend.
    """
    name = os.environ.get(ENV_BACKEND, "").strip()
    if not name:
        return None
    name = {"tflite-runtime": "tflite_runtime", "ai_edge_litert": "ai-edge-litert"}.get(name, name)
    if name not in _MODULES:
        raise ValueError(f"{ENV_BACKEND}={name!r}: not a TFLite backend; use one of "
                         f"{', '.join(_MODULES)} or unset it")
    return name


def _choose_default() -> Tuple[Optional[ModuleType], Optional[str], Optional[str]]:
    try:
        forced = forced_backend()
    except ValueError as exc:  # reported when an interpreter is first wanted, as one line
        return None, None, str(exc)
    for name in [forced] if forced else list(_MODULES):
        module = _import(name)
        if module is not None:
            return module, name, None
    missing = f"{forced} (set by {ENV_BACKEND}) is not installed" if forced else None
    return None, None, missing


_tfl, BACKEND, _BACKEND_PROBLEM = _choose_default()


def backend_version(backend: Optional[str] = None) -> Optional[str]:
    """Returns an interpreter package's version (default: the active backend's), or None."""
    backend = backend or BACKEND
    if backend is None:
        return None
    from importlib import metadata

    try:
        return metadata.version(_DISTRIBUTIONS[backend])
    except metadata.PackageNotFoundError:  # pragma: no cover
        return None


def available_backends() -> Dict[str, Optional[str]]:
    """Returns each importable backend's name and version."""
    return {name: backend_version(name) for name in _MODULES if _import(name) is not None}


def tpu_backend() -> Optional[str]:
    """Chooses the backend for EdgeTPU stages (the rule is in this module's docstring)."""
    if os.environ.get(ENV_BACKEND, "").strip():
        return BACKEND
    available = available_backends()
    if len(available) < 2:
        return BACKEND
    from edgecap import edgetpu_runtime

    return edgetpu_runtime.preferred_backend(edgetpu_runtime.identify(), available) or BACKEND


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


def _require_backend(backend: Optional[str] = None) -> Any:
    if _BACKEND_PROBLEM is not None:
        from edgecap.errors import ConfigError

        raise ConfigError(f"{_BACKEND_PROBLEM}; pip install it or unset {ENV_BACKEND}"
                          if "not installed" in _BACKEND_PROBLEM else _BACKEND_PROBLEM)
    module = _tfl if backend is None or backend == BACKEND else _import(backend)
    if module is None:
        wanted = backend or "a TFLite interpreter"
        raise ImportError(
            f"{wanted} is not installed: pip install ai-edge-litert "
            "(or tflite-runtime on a Coral board)"
        )
    return module


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


def describe_interpreter(model: bytes) -> Any:
    """Creates an interpreter that is never allocated, to read a model's tensors and ops.

    An EdgeTPU-compiled model cannot be allocated on the CPU (its
    ``edgetpu-custom-op`` has no CPU kernel), but its boundary tensors, their
    quantization and its operators can still be read.

    Args:
      model: The model's bytes, already verified (``tflite_verify``).

    Returns:
      An unallocated ``Interpreter``: never invoke it.

    Raises:
      ValueError: If the backend cannot parse the model.
    """
    tfl = _require_backend()
    with _filtered_native_stderr():
        return tfl.Interpreter(model_content=bytes(model))


def load_delegate(library: str, options: Optional[dict] = None, backend: Optional[str] = None) -> Any:
    """Loads a TFLite external delegate (libedgetpu).

    Args:
      library: Shared library name, e.g. ``libedgetpu.so.1``.
      options: Delegate options, e.g. ``{'device': 'usb:0'}``.
      backend: The backend to load it through (default: the active one);
        the interpreter that uses it must come from the same backend.

    Returns:
      The delegate object.

    Raises:
      ValueError: If the library cannot be loaded.
    """
    return _require_backend(backend).load_delegate(library, options or {})


def make_delegate_interpreter(model: "str | os.PathLike[str]", delegates: List[Any],
                              backend: Optional[str] = None) -> Any:
    """Creates an interpreter that runs ``model`` on the given delegates and allocates tensors.

    ``backend`` must be the one the delegates were loaded through (default: the active one).
    """
    interp = _require_backend(backend).Interpreter(
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

    @property
    def output_names(self) -> List[str]:
        """The names of the outputs it returns, in order."""
        return [name for name, _ in self._outputs]

    def __call__(self, tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        for name, index in self._inputs:
            self._set(index, tensors[name])
        self._invoke()
        return {name: self._get(index) for name, index in self._outputs}
