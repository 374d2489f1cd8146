"""models.torch_state: PyTorch state dicts in both torch.save formats, read without PyTorch.

The fixtures are written here byte for byte as torch.save writes them (its
pickle protocol 2, persistent ids for storages, ``_rebuild_tensor_v2``), so
the reader is tested on the format, not on itself.
"""

from __future__ import annotations

import pickle
import struct
import zipfile

import numpy as np
import pytest

from models.torch_state import LEGACY_MAGIC, LEGACY_PROTOCOL, TorchFileError, read_state_dict


class _Storage:
    def __init__(self, key, kind, numel):
        self.key, self.kind, self.numel = key, kind, numel


def _global_bytes(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"  # GLOBAL opcode


def _state_pickle(tensors, legacy):
    """Writes the state dict's pickle by hand: OrderedDict of rebuilt tensors."""
    out = bytearray(b"\x80\x02")
    out += _global_bytes("collections", "OrderedDict") + b")R"  # OrderedDict()
    for name, (storage, offset, size, stride) in tensors.items():
        out += b"X" + struct.pack("<I", len(name)) + name.encode()
        out += _global_bytes("torch._utils", "_rebuild_tensor_v2") + b"("
        # persistent id tuple
        out += b"(X" + struct.pack("<I", 7) + b"storage"
        out += _global_bytes("torch", storage.kind)
        out += b"X" + struct.pack("<I", len(storage.key)) + storage.key.encode()
        out += b"X" + struct.pack("<I", 3) + b"cpu"
        out += b"J" + struct.pack("<i", storage.numel)
        if legacy:
            out += b"N"
        out += b"tQ"  # TUPLE, BINPERSID
        out += b"J" + struct.pack("<i", offset)
        out += b"(" + b"".join(b"J" + struct.pack("<i", s) for s in size) + b"t"
        out += b"(" + b"".join(b"J" + struct.pack("<i", s) for s in stride) + b"t"
        out += b"\x89"  # False
        out += _global_bytes("collections", "OrderedDict") + b")R"
        out += b"tR"  # args tuple, REDUCE
        out += b"s"  # SETITEM
    out += b"."
    return bytes(out)


def _tensors():
    conv = np.arange(2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3) / 7
    bias = np.array([0.5, -1.25], np.float32)
    shared = np.arange(12, dtype=np.float32)  # two tensors share it: a view and a transpose
    storages = {"0": (conv.ravel(), "FloatStorage"), "1": (bias, "FloatStorage"),
                "2": (shared, "FloatStorage"), "3": (np.array([7], np.int64), "LongStorage")}
    specs = {
        "conv.weight": ("0", 0, conv.shape, (27, 9, 3, 1)),
        "bn.bias": ("1", 0, (2,), (1,)),
        "fc.weight": ("2", 2, (2, 3), (3, 1)),  # rows 2..7 of shared
        "fc_t.weight": ("2", 0, (4, 3), (1, 4)),  # a transposed view
        "bn.num_batches_tracked": ("3", 0, (), ()),
    }
    want = {
        "conv.weight": conv, "bn.bias": bias,
        "fc.weight": shared[2:8].reshape(2, 3),
        "fc_t.weight": shared.reshape(3, 4).T,
        "bn.num_batches_tracked": np.array(7, np.int64),
    }
    return storages, specs, want


def _legacy_file(path, storages, specs):
    refs = {n: (_Storage(k, storages[k][1], storages[k][0].size), o, s, st)
            for n, (k, o, s, st) in specs.items()}
    with open(path, "wb") as f:
        pickle.dump(LEGACY_MAGIC, f, protocol=2)
        pickle.dump(LEGACY_PROTOCOL, f, protocol=2)
        pickle.dump({"protocol_version": LEGACY_PROTOCOL, "little_endian": True,
                     "type_sizes": {"short": 2, "int": 4, "long": 4}}, f, protocol=2)
        f.write(_state_pickle(refs, legacy=True))
        pickle.dump(list(storages), f, protocol=2)
        for key, (data, _) in storages.items():
            f.write(struct.pack("<q", data.size))
            f.write(data.tobytes())


def _zip_file(path, storages, specs):
    refs = {n: (_Storage(k, storages[k][1], storages[k][0].size), o, s, st)
            for n, (k, o, s, st) in specs.items()}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", _state_pickle(refs, legacy=False))
        z.writestr("archive/version", "3\n")
        for key, (data, _) in storages.items():
            z.writestr(f"archive/data/{key}", data.tobytes())


@pytest.mark.parametrize("writer", [_legacy_file, _zip_file], ids=["legacy", "zip"])
def test_both_torch_save_formats_give_the_tensors_with_their_shapes_offsets_and_strides(tmp_path, writer):
    storages, specs, want = _tensors()
    writer(tmp_path / "w.pth", storages, specs)
    got = read_state_dict(tmp_path / "w.pth")
    assert list(got) == list(want)  # the file's order
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def test_a_pickle_that_names_any_other_global_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    evil = (b"\x80\x02" + _global_bytes("os", "system") + b"X"
            + struct.pack("<I", len(f"touch {marker}")) + f"touch {marker}".encode() + b"\x85R.")
    with zipfile.ZipFile(tmp_path / "evil.pth", "w") as z:
        z.writestr("archive/data.pkl", evil)
    with pytest.raises(TorchFileError, match="os.system"):
        read_state_dict(tmp_path / "evil.pth")
    assert not marker.exists()


def test_a_truncated_legacy_file_and_a_non_torch_file_are_one_line_errors(tmp_path):
    storages, specs, _ = _tensors()
    _legacy_file(tmp_path / "w.pth", storages, specs)
    data = (tmp_path / "w.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[:-20])
    with pytest.raises(TorchFileError, match="truncated") as e:
        read_state_dict(tmp_path / "cut.pth")
    assert "\n" not in str(e.value)
    (tmp_path / "text.pth").write_text("not a model\n")
    with pytest.raises(TorchFileError, match="text.pth") as e:
        read_state_dict(tmp_path / "text.pth")
    assert "\n" not in str(e.value)
