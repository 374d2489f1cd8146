"""The supported-configurations matrix (``data/configurations.json``): what runs the TPU, per libedgetpu.

For each kind of libedgetpu (``edgecap.edgetpu_runtime``'s builds) a *stack*
says which interpreter package, numpy and OpenCV run compiled segments on the
TPU, and on which Pythons their wheels exist; *targets* are the boards and
OSes, each with its stack and how it was checked here. deploy/install.sh
reads the same file to install a stack, and the probe's advice names only the
stacks this Python can install (``routes``).

This module imports only ``edgecap.schema`` and ``edgecap.errors``.
"""

from __future__ import annotations

import platform
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import List, Optional

import msgspec

from edgecap import schema
from edgecap.errors import ConfigError

MATRIX = Path(__file__).parent / "data" / "configurations.json"


class Wheels(msgspec.Struct, forbid_unknown_fields=True):
    """Where an interpreter requirement has wheels (checked with ``pip download``)."""

    requirement: str
    python: List[str]
    machines: List[str]
    glibc: str
    source: str


class Stack(msgspec.Struct, forbid_unknown_fields=True):
    """The packages that run one kind of libedgetpu build."""

    id: str
    build: str
    tf_min: Optional[str]
    tf_below: Optional[str]
    interpreter: str
    backend: str
    numpy: str
    opencv: str
    python: List[str]
    source: str

    @property
    def pip(self) -> str:
        """The pip arguments that install it, quoted for a shell."""
        return " ".join(f"'{r}'" for r in (self.interpreter, self.numpy, self.opencv))


class Target(msgspec.Struct, forbid_unknown_fields=True):
    """A board and OS with the stack that runs its TPU."""

    id: str
    board: str
    os: str
    machine: str
    glibc: str
    system_python: str
    libedgetpu: str
    stack: str
    python_route: str
    checked: List[str]
    source: str


class Refused(msgspec.Struct, forbid_unknown_fields=True):
    """A platform where nothing can work."""

    machine: str
    why: str
    source: str


class Check(msgspec.Struct, forbid_unknown_fields=True):
    """One configuration ``make test-boards`` runs (``native:...`` here, ``qemu:...`` under qemu)."""

    id: str
    runs: str
    python: str
    requirements: List[str]
    backend: str


class Matrix(msgspec.Struct, forbid_unknown_fields=True):
    """``data/configurations.json``."""

    about: str
    wheels: List[Wheels]
    stacks: List[Stack]
    targets: List[Target]
    refused: List[Refused]
    checks: List[Check]


@lru_cache(maxsize=None)
def load(path: Path = MATRIX) -> Matrix:
    """Reads the matrix.

    Raises:
      ConfigError: If the file is missing or malformed, or a target names a
        stack the file lacks.
    """
    matrix = schema.read_file(path, Matrix, what="configurations matrix", fix="reinstall edgecap",
                              error=ConfigError)
    stacks = {s.id for s in matrix.stacks}
    for t in matrix.targets:
        if t.stack not in stacks:
            raise ConfigError(f"{path}: target {t.id} names stack '{t.stack}', which is not in stacks")
    return matrix


def _version(text: Optional[str]) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", text or "")[:3])


def stacks_for(build: Optional[str], tf_version: Optional[str] = None,
               matrix: Optional[Matrix] = None) -> List[Stack]:
    """The stacks that run a libedgetpu build (``coral-tf2.5``, ``rebuilt``); all of them for an unknown one."""
    found = []
    for s in (matrix or load()).stacks:
        if build is not None and s.build != build:
            continue
        if tf_version and s.tf_min and _version(tf_version) < _version(s.tf_min):
            continue
        if tf_version and s.tf_below and _version(tf_version) >= _version(s.tf_below):
            continue
        found.append(s)
    return found


def this_python() -> str:
    """``major.minor`` of the running Python."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def routes(build: Optional[str], tf_version: Optional[str] = None, python: Optional[str] = None,
           machine: Optional[str] = None, matrix: Optional[Matrix] = None) -> List[str]:
    """How to get a working stack for a build, in words, naming only what exists.

    A stack whose interpreter has a wheel for ``python`` on ``machine`` is a
    ``pip install`` into this Python; one that needs another Python says which.

    Args:
      build, tf_version: The installed libedgetpu (``edgecap.edgetpu_runtime.Build``).
      python: ``major.minor`` (default: this one).
      machine: ``platform.machine()`` (default: this one).
    """
    matrix = matrix or load()
    python = python or this_python()
    machine = machine or platform.machine()
    out = []
    for s in stacks_for(build, tf_version, matrix):
        wheels = next((w for w in matrix.wheels if w.requirement == s.interpreter), None)
        has = wheels is None or (python in wheels.python and machine in wheels.machines)
        if has and python in s.python:
            out.append(f"pip install {s.pip} and set EDGECAP_BACKEND={s.backend}")
        else:
            pythons = [p for p in s.python if wheels is None or p in wheels.python]
            if pythons:
                out.append(f"a Python {' or '.join(pythons)} venv with {s.pip} ({s.interpreter} has no "
                           f"wheel for Python {python} on {machine}; deploy/install.sh --python "
                           f"PATH/python{pythons[-1]} installs it)")
    return out
