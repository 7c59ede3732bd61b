"""The rest of an epoch after an elastic reset, split over the workers there are now.

An epoch's order is its permutation (splits.epoch_permutation); elastic training
remembers how many of its examples are done, and after a resize the rest is
split into global batches of the new size, exactly as a normal run splits a
whole epoch.
"""

import numpy as np
import tensorflow as tf

from hvd_mnist.data import splits


def rest_of_epoch(order: np.ndarray, start: int, end: int, per_rank_batch_size: int,
                  rank: int, size: int):
    """This rank's batches of examples order[start:end], and each step's examples over all ranks.

    Whole global batches are split as splits.rank_batch_indices splits them (so an
    epoch that starts at 0 is exactly a normal run's); what is left after them (only
    after a resize) is one last, shorter step, split as evenly as possible.
    """
    rest = order[start:end]
    global_batch_size = per_rank_batch_size * size
    full_steps = len(rest) // global_batch_size
    batches = list(splits.rank_batch_indices(rest, full_steps, per_rank_batch_size, rank, size))
    step_examples = [global_batch_size] * full_steps
    tail = rest[full_steps * global_batch_size:]
    if len(tail):
        batches.append(tail[rank::size])
        step_examples.append(len(tail))
    return batches, step_examples


def batches_dataset(split: splits.Split, batches: list, per_rank_batch_size: int,
                    dtype=tf.float32) -> tf.data.Dataset:
    """The batches as splits.batches_from_indices makes them, plus a last short (even empty) one."""
    full = [b for b in batches if len(b) == per_rank_batch_size]
    dataset = splits.batches_from_indices(
        split, np.concatenate(full) if full else np.zeros([0], np.int64), per_rank_batch_size,
        dtype)
    if len(full) < len(batches):
        images, labels = tf.constant(split.images), tf.constant(split.labels)
        tail = tf.data.Dataset.from_tensors(batches[-1].astype(np.int64)).map(
            lambda i: splits.normalize(tf.gather(images, i), tf.gather(labels, i), dtype))
        dataset = dataset.concatenate(tail)
    return dataset
