"""Reading and writing MNIST's IDX files (written gzip-compressed; read either way), with validation.

IDX is big-endian: a magic number (2051 for images, 2049 for labels), the
dimension sizes, then unsigned bytes. Every way a file can be wrong here is
reported as a DataError naming the file, never as a numpy reshape error.
"""

import gzip
import os
import struct

import numpy as np

from hvd_mnist.data import mnist
from hvd_mnist.errors import DataError

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049

# The standard names, as the MNIST distribution and TFDS's builder use them.
FILENAMES = {
    "train_data": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_data": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def write_images(path: str, images: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(f"expected uint8 images of shape (n, rows, cols), got {images.dtype} "
                         f"{images.shape}")
    header = struct.pack(">IIII", IMAGES_MAGIC, *images.shape)
    _write_gz(path, header + images.tobytes())


def write_labels(path: str, labels: np.ndarray) -> None:
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(f"expected uint8 labels of shape (n,), got {labels.dtype} {labels.shape}")
    _write_gz(path, struct.pack(">II", LABELS_MAGIC, len(labels)) + labels.tobytes())


def _write_gz(path: str, payload: bytes) -> None:
    # mtime=0 makes the compressed bytes depend on the content alone.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(payload)


def read_images(path: str) -> np.ndarray:
    """Images as uint8 (n, 28, 28); DataError if the file is not 28x28 IDX images."""
    data = _read_bytes(path)
    n, rows, cols = _parse_header(path, data, IMAGES_MAGIC, ndims=3)
    if (rows, cols) != (mnist.IMAGE_SIDE, mnist.IMAGE_SIDE):
        raise DataError(f"{path}: images are {rows}x{cols}, MNIST images are "
                        f"{mnist.IMAGE_SIDE}x{mnist.IMAGE_SIDE}")
    pixels = _payload(path, data, header_bytes=16, expected=n * rows * cols)
    return pixels.reshape(n, rows, cols)


def read_labels(path: str) -> np.ndarray:
    """Labels as uint8 (n,); DataError on a bad header, short file or label outside 0..9."""
    data = _read_bytes(path)
    (n,) = _parse_header(path, data, LABELS_MAGIC, ndims=1)
    labels = _payload(path, data, header_bytes=8, expected=n)
    if labels.size and labels.max() >= mnist.NUM_CLASSES:
        bad = int(np.argmax(labels >= mnist.NUM_CLASSES))
        raise DataError(f"{path}: label {labels[bad]} at index {bad} is outside "
                        f"0..{mnist.NUM_CLASSES - 1}")
    return labels


def read_pair(image_path: str, label_path: str):
    images, labels = read_images(image_path), read_labels(label_path)
    if len(images) != len(labels):
        raise DataError(f"{image_path} has {len(images)} images but {label_path} has "
                        f"{len(labels)} labels")
    return images, labels


GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: str) -> bytes:
    """The file's IDX bytes: gunzipped when it is gzip, as is otherwise (a gunzipped
    MNIST download)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as f:
        raw = f.read()
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as e:  # cut off mid-stream, or damaged
        raise DataError(f"{path}: not a complete gzip file ({e})") from None


def _parse_header(path, data, magic, ndims):
    header_bytes = 4 + 4 * ndims
    # The magic first: a short labels file given for images is a wrong file, not a short one.
    if len(data) >= 4 and (found := struct.unpack(">I", data[:4])[0]) != magic:
        kind = "images" if magic == IMAGES_MAGIC else "labels"
        raise DataError(f"{path}: magic number {found}, expected {magic} for IDX {kind}")
    if len(data) < header_bytes:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes)")
    return struct.unpack(f">{ndims}I", data[4:header_bytes])


def _payload(path, data, header_bytes, expected):
    got = len(data) - header_bytes
    if got != expected:
        raise DataError(f"{path}: header promises {expected} bytes of data, file has {got} "
                        f"({'truncated' if got < expected else 'trailing bytes'})")
    return np.frombuffer(data, dtype=np.uint8, offset=header_bytes)
