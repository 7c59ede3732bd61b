"""The prepared splits decoded once, so a training process reads MNIST in milliseconds.

TFDS stores every image PNG-encoded: `tfds.load` decodes all 70,000 of them in every
process of every run (2.4 s per process on an AVX-512 core, about 6.5 s on an AVX2-only
one; four times over at -np 4). `prepare` (make data) decodes them once and writes each
split's uint8 images and int64 labels as TensorFlow TensorProtos (`tf.io.serialize_tensor`),
with the name, size and sha256 of every TFDS file they came from and of its own files
(integrity.py); reading them back takes 0.1 s. A reader checks the TFDS files now in
data_dir against that record, refusing a stale copy, and its own files, refusing a damaged
one, each with one line.

    <data_dir>/hvd_mnist_decoded/mnist-3.0.1/{train,test}-{images,labels}.tensor, source.json
"""

import glob
import json
import os

import numpy as np
import tensorflow as tf

from hvd_mnist.data import integrity
from hvd_mnist.errors import DataError

DIRECTORY = "hvd_mnist_decoded"
SOURCE_FILE = "source.json"  # also make data's stamp: written last
FORMAT = 2  # 2: the copy's own files are recorded too


def directory(data_dir: str, dataset: str, version: str) -> str:
    return os.path.join(data_dir, DIRECTORY, f"{dataset}-{version}")


def tfds_files(dataset_dir: str, dataset: str, split: str) -> list:
    """The TFDS record files of one split, in order."""
    return sorted(glob.glob(os.path.join(dataset_dir, f"{dataset}-{split}.tfrecord-*")))


def _tensor_path(out_dir: str, split: str, what: str) -> str:
    return os.path.join(out_dir, f"{split}-{what}.tensor")


def _tensor_paths(out_dir: str, split: str) -> list:
    return [_tensor_path(out_dir, split, what) for what in ("images", "labels")]


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
        split: {"examples": len(labels), "tfds_files": integrity.fingerprint(sources[split]),
                "files": integrity.fingerprint(_tensor_paths(out_dir, split))}
        for split, (_, labels) in splits.items()}}
    with open(source_path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(source_path + ".tmp", source_path)


def recorded_split(out_dir: str, split: str, problem: str):
    """source.json's record of `split`, or None where no copy was written.

    DataError, `problem` formatted with the reason, when the record cannot be read or
    is of another format.
    """
    source_path = os.path.join(out_dir, SOURCE_FILE)
    if not os.path.exists(source_path):
        return None
    try:
        with open(source_path) as f:
            record = json.load(f)
        if record["format"] != FORMAT:
            raise DataError(problem.format(f" (format {record['format']}, not {FORMAT})"))
        return record["splits"][split]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(problem.format(f" ({SOURCE_FILE}: {e})")) from None


def read(out_dir: str, split: str, tfds_paths: list, remake_command: str):
    """(images, labels) of `split`, or None where no decoded copy was written.

    DataError, naming `remake_command`, when the copy does not match the TFDS files in
    `tfds_paths` (they were prepared again, or changed), when one of its own files is not
    what was written (damaged), or when it cannot be read.
    """
    stale = (f"the decoded copy in {out_dir} does not match the TFDS files it was made "
             f"from{{}}; make it again with: {remake_command}")
    expected = recorded_split(out_dir, split, stale)
    if expected is None:
        return None
    if integrity.fingerprint(tfds_paths) != expected["tfds_files"]:
        raise DataError(stale.format(f" ({split} split changed since)"))
    _check_files(out_dir, expected, remake_command)
    try:
        images = _read_tensor(_tensor_path(out_dir, split, "images"), tf.uint8)
        labels = _read_tensor(_tensor_path(out_dir, split, "labels"), tf.int64)
    except tf.errors.OpError as e:
        raise DataError(stale.format(f" ({e.message.splitlines()[0]})")) from None
    if len(labels) != expected["examples"] or images.shape[0] != len(labels):
        raise DataError(stale.format(f" ({split}: {images.shape[0]} images, {len(labels)} "
                                     f"labels, {expected['examples']} expected)"))
    return images, labels


def check_files(out_dir: str, split: str, remake_command: str) -> None:
    """DataError naming the first of the copy's own files of `split` that is missing or not
    what was written, or naming the copy when it has no record of them."""
    problem = f"the decoded copy in {out_dir} is damaged{{}}" + _advice("make it", remake_command)
    expected = recorded_split(out_dir, split, problem)
    if expected is None:
        raise DataError(problem.format(f" ({SOURCE_FILE} is missing)"))
    _check_files(out_dir, expected, remake_command)


def _check_files(out_dir: str, expected: dict, remake_command: str) -> None:
    # Hashing the files before TensorFlow reads them costs 41 ms a process for both
    # splits (reports/startup_integrity.md; the second read comes from the page cache),
    # against the 2 s and more of decoding that the copy saves.
    difference = integrity.first_difference(out_dir, expected["files"])
    if difference:
        path, reason = difference
        raise DataError(f"{path} is damaged ({reason})"
                        + _advice("make the decoded copy", remake_command))


def check_tfds_files(out_dir: str, dataset_dir: str, split: str, remake_command: str,
                     rank: int = 0, size: int = 1) -> None:
    """DataError naming the first TFDS record file of `split` in `dataset_dir` whose size or
    sha256 is not what make data recorded when it made the copy in `out_dir`: of the files
    TFDS gives rank `rank` of `size` (file i to rank i % size), all of them by default.

    For --input=stream|files, which read these files every epoch: TF's reader notices a
    damaged record only when it reaches it, mid-epoch and on one rank alone, where the
    other ranks would wait for it in the next allreduce.
    """
    problem = (f"the {split} split's TFDS record files in {dataset_dir} cannot be checked{{}}"
               + _advice("prepare them", remake_command))
    expected = recorded_split(out_dir, split, problem)
    if expected is None:
        raise DataError(problem.format(f" (no {os.path.join(out_dir, SOURCE_FILE)}, where "
                                       "make data records their sizes and sha256s)"))
    difference = integrity.first_difference(dataset_dir, expected["tfds_files"][rank::size])
    if difference:
        path, reason = difference
        raise DataError(f"{path} is damaged ({reason})" + _advice("prepare it", remake_command))


def _advice(what: str, remake_command: str) -> str:
    """What to run, at the end of an error line; "" without a command (prepare's own check)."""
    return f"; {what} again with: {remake_command}" if remake_command else ""


def _read_tensor(path: str, dtype) -> np.ndarray:
    return tf.io.parse_tensor(tf.io.read_file(path), dtype).numpy()
