"""make data's decoded MNIST with numpy alone, for the PyTorch job (torch_ddp.py) in a venv
without TensorFlow. The decoded copy (hvd_mnist/data/decoded.py) holds each array as a
TensorProto (tf.io.serialize_tensor), read here from the protobuf's few fields, never
unpickled, after the checks hvd_mnist's reader makes: the TFDS record files and the copy's
own files against the sizes and sha256s make data recorded (integrity.py, no TensorFlow).
"""

import glob
import json
import os

import numpy as np

from hvd_mnist.data import integrity

# splits.decoded_dir and splits.dataset_dir, which import TensorFlow.
DATASET_DIR = os.path.join("mnist", "3.0.1")
DECODED_DIR = os.path.join("hvd_mnist_decoded", "mnist-3.0.1")
# TensorFlow's DataType enum values of the two arrays' dtypes.
DTYPES = {4: np.uint8, 9: np.int64}


def _varint(data: bytes, position: int):
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, position


def _fields(data: bytes):
    """(field number, value) of a protobuf message's top-level fields: an int for a varint,
    bytes for a length-delimited field."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(data, position)
        elif wire_type == 2:
            length, position = _varint(data, position)
            value, position = data[position:position + length], position + length
        else:  # fixed64 and fixed32: no field of these tensors has them
            raise ValueError(f"protobuf wire type {wire_type} in a TensorProto")
        yield number, value


def parse_tensor(data: bytes) -> np.ndarray:
    """A TensorProto's array: dtype (field 1), shape (field 2: dims, field 2, each with its
    size in field 1) and tensor_content (field 4, absent when empty), as
    tf.io.serialize_tensor writes them."""
    dtype, shape, content = None, [], b""
    for number, value in _fields(data):
        if number == 1:
            dtype = DTYPES.get(value)
            if dtype is None:
                raise ValueError(f"TensorProto of TensorFlow dtype {value}, not uint8 or int64")
        elif number == 2:
            shape = [dict(_fields(dim)).get(1, 0) for n, dim in _fields(value) if n == 2]
        elif number == 4:
            content = value
    if dtype is None:
        raise ValueError("not a TensorProto: no dtype")
    return np.frombuffer(content, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def load_split(data_dir: str, split: str):
    """(uint8 images (n, 28, 28, 1), int64 labels (n,)) of the decoded copy in data_dir,
    after checking it and the TFDS files it was made from as hvd_mnist does."""
    copy_dir = os.path.join(data_dir, DECODED_DIR)
    with open(os.path.join(copy_dir, "source.json")) as f:
        record = json.load(f)["splits"][split]
    tfds_dir = os.path.join(data_dir, DATASET_DIR)
    tfds_files = sorted(glob.glob(os.path.join(tfds_dir, f"mnist-{split}.tfrecord-*")))
    if integrity.fingerprint(tfds_files) != record["tfds_files"]:
        raise SystemExit(f"{copy_dir} does not match the TFDS files in {tfds_dir}: make data")
    difference = integrity.first_difference(copy_dir, record["files"])
    if difference:
        raise SystemExit(f"{difference[0]} is damaged ({difference[1]}): make data")
    arrays = []
    for what in ("images", "labels"):
        with open(os.path.join(copy_dir, f"{split}-{what}.tensor"), "rb") as f:
            arrays.append(parse_tensor(f.read()))
    return tuple(arrays)
