"""A TensorFlow.js graph model (``model.json`` + weight shards) as a TensorFlow function.

The tfjs format is a GraphDef written as JSON with the constants' values moved
to binary shards (``weightsManifest``); the ``tensorflowjs`` package is not
needed to read it back. Float weights may be stored as float16
(``quantization.dtype``) and int64 ones as int32, as the tfjs converter writes
them; both are widened to the dtype the graph's node declares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

_DTYPES = {"float32": np.float32, "int32": np.int32, "bool": np.bool_, "float16": np.float16,
           "uint8": np.uint8, "int8": np.int8}


def read_weights(model_json: Path) -> Dict[str, np.ndarray]:
    """Returns every weight of a tfjs model by node name, as the manifest stores it (widened to 32 bits).

    Raises:
      ValueError: If a shard is shorter than the manifest says.
    """
    meta = json.loads(model_json.read_text())
    out: Dict[str, np.ndarray] = {}
    for group in meta["weightsManifest"]:
        data = b"".join((model_json.parent / p).read_bytes() for p in group["paths"])
        offset = 0
        for w in group["weights"]:
            quant = w.get("quantization") or {}
            stored = np.dtype(_DTYPES[quant.get("dtype", w["dtype"])])
            count = int(np.prod(w["shape"])) if w["shape"] else 1
            end = offset + count * stored.itemsize
            if end > len(data):
                raise ValueError(f"{model_json}: weight {w['name']} runs past the shards' {len(data)} bytes")
            values = np.frombuffer(data[offset:end], stored).reshape(w["shape"])
            if "scale" in quant:  # affine uint8/uint16 quantization
                values = values.astype(np.float32) * quant["scale"] + quant.get("min", 0.0)
            out[w["name"]] = values.astype(_DTYPES[w["dtype"]]) if stored != np.dtype(_DTYPES[w["dtype"]]) else values
            offset = end
    return out


def load_graph_function(model_json: "str | Path", outputs: Sequence[str],
                        replace: Optional[Dict[str, float]] = None):
    """Imports a tfjs graph model and returns it as a concrete TensorFlow function.

    Args:
      model_json: The model's ``model.json``; its shards lie beside it.
      outputs: Tensor names to fetch (e.g. ``"Identity:0"``), in the order returned.
      replace: Scalar constants to give another value, by node name.

    Returns:
      A function of the model's single input (``signature.inputs``) returning
      the listed tensors.
    """
    import tensorflow as tf
    from google.protobuf import json_format

    model_json = Path(model_json)
    meta = json.loads(model_json.read_text())
    graph_def = json_format.ParseDict(meta["modelTopology"], tf.compat.v1.GraphDef(),
                                      ignore_unknown_fields=True)
    weights = read_weights(model_json)
    for name, value in (replace or {}).items():
        if name not in weights:
            raise ValueError(f"{model_json}: no constant {name!r} to replace")
        weights[name] = np.asarray(value, weights[name].dtype)
    for node in graph_def.node:
        if node.op == "Const" and node.name in weights:
            dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
            node.attr["value"].tensor.CopyFrom(
                tf.make_tensor_proto(weights[node.name].astype(dtype.as_numpy_dtype)))
    (input_name,) = meta["signature"]["inputs"]

    def _import():
        tf.compat.v1.import_graph_def(graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(_import, [])
    return wrapped.prune(feeds=[input_name], fetches=list(outputs))
