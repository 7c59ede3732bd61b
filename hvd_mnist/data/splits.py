"""MNIST from TFDS into tf.data, sharded by rank.

Order of operations per epoch, identical on every rank:
  permutation of all training examples from (seed, epoch)
  -> keep steps * global_batch of them -> rank r takes positions r, r+size, ...
  -> consecutive per-rank batches.
So the union of all ranks' batches at step t is always the same global batch,
whatever the number of ranks, every example is seen by exactly one rank per
epoch, and every rank runs the same number of steps. MNIST fits in memory, so
each split is loaded once (from its decoded copy, decoded.py) and batches are
gathered by index.
"""

import os

import numpy as np
import tensorflow as tf

from hvd_mnist.data import decoded
# The order of the examples over the ranks; train_epoch_indices calls rank_batch_indices
# through this module, so tests/broken_trainer.py can replace it here.
from hvd_mnist.data.order import epoch_permutation, eval_indices, rank_batch_indices  # noqa: F401
from hvd_mnist.errors import DataError, short_reason

DATASET = "mnist"
DATASET_VERSION = "3.0.1"
SPLITS = ("train", "test")
PREPARE_COMMAND = "make data (or: python -m hvd_mnist.prepare --data_dir={data_dir})"


class Split:
    """One split held in memory: uint8 images (n, 28, 28, 1) and int64 labels (n,)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images = images
        self.labels = labels

    def __len__(self):
        return len(self.labels)


def check_prepared(data_dir: str) -> None:
    """Fails with the command to run when data_dir has no prepared TFDS mnist."""
    info = os.path.join(dataset_dir(data_dir), "dataset_info.json")
    if not os.path.isfile(info):
        raise DataError(f"no prepared TFDS {DATASET} {DATASET_VERSION} in {data_dir!r}; "
                        f"prepare it with: {PREPARE_COMMAND.format(data_dir=data_dir)}")


def dataset_dir(data_dir: str) -> str:
    """Where TFDS keeps the prepared dataset."""
    return os.path.join(data_dir, DATASET, DATASET_VERSION)


def decoded_dir(data_dir: str) -> str:
    return decoded.directory(data_dir, DATASET, DATASET_VERSION)


def check_record_files(data_dir: str, split: str, rank: int = 0, size: int = 1) -> None:
    """Fails, naming the file and the prepare command, when a TFDS record file of `split`
    that rank `rank` of `size` reads (all of them by default) is not what make data wrote."""
    decoded.check_tfds_files(decoded_dir(data_dir), dataset_dir(data_dir), split,
                             PREPARE_COMMAND.format(data_dir=data_dir), rank, size)


def damaged_part(data_dir: str) -> tuple[str, str]:
    """What of data_dir prepare must write again, and why: ("", "") when its TFDS record
    files and its decoded copy are what make data wrote, ("copy", reason) when only the
    copy is missing or damaged, ("records", reason) otherwise (reason "": nothing there)."""
    try:
        check_prepared(data_dir)
    except DataError:
        return "records", ""
    try:
        for split in SPLITS:
            decoded.check_tfds_files(decoded_dir(data_dir), dataset_dir(data_dir), split, "")
    except DataError as e:
        return "records", str(e)
    try:
        for split in SPLITS:
            decoded.check_files(decoded_dir(data_dir), split, "")
    except DataError as e:
        return "copy", str(e)
    return "", ""


def load_split(data_dir: str, split: str) -> Split:
    """A whole split: from the decoded copy prepare wrote (decoded.py) in milliseconds,
    else decoded from the TFDS files through tfds.load; never touching the network."""
    check_prepared(data_dir)
    copy = decoded.read(decoded_dir(data_dir), split,
                        decoded.tfds_files(dataset_dir(data_dir), DATASET, split),
                        PREPARE_COMMAND.format(data_dir=data_dir))
    return Split(*copy) if copy is not None else decode_split(data_dir, split)


def decode_split(data_dir: str, split: str) -> Split:
    """A whole split decoded from the TFDS files (each image is a PNG): seconds, not ms."""
    import tensorflow_datasets as tfds  # slow import; only needed here

    check_prepared(data_dir)
    try:
        images, labels = tfds.as_numpy(tfds.load(
            DATASET, split=split, data_dir=data_dir, download=False, as_supervised=True,
            batch_size=-1, shuffle_files=False))
    except (tf.errors.OpError, AssertionError, ValueError) as e:
        files = os.path.join(dataset_dir(data_dir), f"{DATASET}-{split}.tfrecord-*")
        raise DataError(f"cannot read the {split} split of {DATASET} from {files} "
                        f"({short_reason(e)}); the prepared files are damaged or incomplete: "
                        f"prepare them again with: {PREPARE_COMMAND.format(data_dir=data_dir)}"
                        ) from None
    return Split(images, labels.astype(np.int64))


def write_decoded(data_dir: str) -> str:
    """Decodes both splits from the TFDS files once and writes the copy load_split reads."""
    splits, sources = {}, {}
    for split in SPLITS:
        decoded_split = decode_split(data_dir, split)
        splits[split] = (decoded_split.images, decoded_split.labels)
        sources[split] = decoded.tfds_files(dataset_dir(data_dir), DATASET, split)
    out_dir = decoded_dir(data_dir)
    decoded.write(out_dir, splits, sources)
    return out_dir


def seed_from_words(words) -> int:
    """A 63-bit seed from a sequence of ints (say (seed, rank, epoch)), the same everywhere."""
    return int(np.random.SeedSequence(list(words)).generate_state(1, np.uint64)[0]) >> 1


def normalize(images: tf.Tensor, labels: tf.Tensor, dtype=tf.float32):
    """uint8 [0, 255] (…, 28, 28, 1) -> [0, 1] in `dtype` (float64 with --precision=float64)."""
    return tf.cast(images, dtype) / 255.0, labels


def without_autotuning(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Fixed parallelism and buffers: the autotuner's thread made deleting an exhausted
    iterator wait up to ~10 s at the end of every other epoch."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def batches_from_indices(split: Split, indices: np.ndarray, batch_size: int,
                         dtype=tf.float32) -> tf.data.Dataset:
    """Normalised (images, labels) batches of the given examples, in the given order.

    Batching indices first and gathering whole batches keeps the pipeline far
    ahead of training (hundreds of times); the last batch is short when
    batch_size does not divide.
    """
    images = tf.constant(split.images)
    labels = tf.constant(split.labels)
    ds = tf.data.Dataset.from_tensor_slices(indices.astype(np.int64)).batch(batch_size)
    ds = ds.map(lambda i: normalize(tf.gather(images, i), tf.gather(labels, i), dtype))
    return without_autotuning(ds.prefetch(2))


def train_epoch_indices(num_examples: int, *, seed: int, epoch: int, steps: int,
                        per_rank_batch_size: int, rank: int, size: int) -> np.ndarray:
    """This rank's training examples for one epoch, in order: steps * per-rank batch."""
    order = epoch_permutation(seed, epoch, num_examples)
    return rank_batch_indices(order, steps, per_rank_batch_size, rank, size).reshape(-1)
