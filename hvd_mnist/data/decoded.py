"""The prepared splits decoded once, so a training process reads MNIST in milliseconds.

TFDS stores every image PNG-encoded: `tfds.load` decodes all 70,000 of them in every
process of every run (2.4 s per process on an AVX-512 core, about 6.5 s on an AVX2-only
one; four times over at -np 4). `prepare` (make data) decodes them once and writes each
split's uint8 images and int64 labels as TensorFlow TensorProtos (`tf.io.serialize_tensor`),
with the name, size and sha256 of every TFDS file they came from; reading them back takes
0.1 s. A reader checks those against the TFDS files now in data_dir and refuses a stale
copy with one line.

    <data_dir>/hvd_mnist_decoded/mnist-3.0.1/{train,test}-{images,labels}.tensor, source.json
"""

import glob
import hashlib
import json
import os

import numpy as np
import tensorflow as tf

from hvd_mnist.errors import DataError

DIRECTORY = "hvd_mnist_decoded"
SOURCE_FILE = "source.json"  # also make data's stamp: written last
FORMAT = 1


def directory(data_dir: str, dataset: str, version: str) -> str:
    return os.path.join(data_dir, DIRECTORY, f"{dataset}-{version}")


def tfds_files(dataset_dir: str, dataset: str, split: str) -> list:
    """The TFDS record files of one split, in order."""
    return sorted(glob.glob(os.path.join(dataset_dir, f"{dataset}-{split}.tfrecord-*")))


def fingerprint(paths: list) -> list:
    """Name, size and sha256 of each file (~30 ms for MNIST's 23 MB)."""
    def sha256(path):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
        return digest.hexdigest()
    return [{"name": os.path.basename(p), "bytes": os.path.getsize(p), "sha256": sha256(p)}
            for p in paths]


def _tensor_path(out_dir: str, split: str, what: str) -> str:
    return os.path.join(out_dir, f"{split}-{what}.tensor")


def write(out_dir: str, splits: dict, sources: dict) -> None:
    """splits: name -> (uint8 images (n, 28, 28, 1), int64 labels (n,)); sources: name ->
    the TFDS files the split was decoded from. source.json goes last, so a copy cut short
    by a crash is missing, never half-valid."""
    os.makedirs(out_dir, exist_ok=True)
    source_path = os.path.join(out_dir, SOURCE_FILE)
    if os.path.exists(source_path):
        os.remove(source_path)
    for split, (images, labels) in splits.items():
        for what, array in (("images", images), ("labels", labels)):
            tf.io.write_file(_tensor_path(out_dir, split, what), tf.io.serialize_tensor(array))
    record = {"format": FORMAT, "splits": {
        split: {"examples": len(labels), "tfds_files": fingerprint(sources[split])}
        for split, (_, labels) in splits.items()}}
    with open(source_path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(source_path + ".tmp", source_path)


def read(out_dir: str, split: str, tfds_paths: list, remake_command: str):
    """(images, labels) of `split`, or None where no decoded copy was written.

    DataError, naming `remake_command`, when the copy does not match the TFDS files in
    `tfds_paths` (they were prepared again, or changed) or cannot be read.
    """
    source_path = os.path.join(out_dir, SOURCE_FILE)
    if not os.path.exists(source_path):
        return None
    stale = (f"the decoded copy in {out_dir} does not match the TFDS files it was made "
             f"from{{}}; make it again with: {remake_command}")
    try:
        with open(source_path) as f:
            record = json.load(f)
        expected = record["splits"][split]
        if record["format"] != FORMAT:
            raise DataError(stale.format(f" (format {record['format']}, not {FORMAT})"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(stale.format(f" ({SOURCE_FILE}: {e})")) from None
    if fingerprint(tfds_paths) != expected["tfds_files"]:
        raise DataError(stale.format(f" ({split} split changed since)"))
    try:
        images = _read_tensor(_tensor_path(out_dir, split, "images"), tf.uint8)
        labels = _read_tensor(_tensor_path(out_dir, split, "labels"), tf.int64)
    except tf.errors.OpError as e:
        raise DataError(stale.format(f" ({e.message.splitlines()[0]})")) from None
    if len(labels) != expected["examples"] or images.shape[0] != len(labels):
        raise DataError(stale.format(f" ({split}: {images.shape[0]} images, {len(labels)} "
                                     f"labels, {expected['examples']} expected)"))
    return images, labels


def _read_tensor(path: str, dtype) -> np.ndarray:
    return tf.io.parse_tensor(tf.io.read_file(path), dtype).numpy()
