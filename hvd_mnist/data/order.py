"""Which examples each rank takes, and in what order: numpy only, so a process without
TensorFlow (tools/bench/torch_ddp.py) orders MNIST exactly as hvd_mnist does.

Per epoch, identical on every rank: a permutation of all training examples from (seed,
epoch); its first steps * global batch examples; rank r takes positions r, r+size, ...
"""

import numpy as np


def epoch_permutation(seed: int, epoch: int, num_examples: int, stream: int = -1) -> np.ndarray:
    """The epoch's example order, from (seed, epoch) only: never from rank or size.

    `stream` >= 0 gives an independent order per stream, for the literal Keras
    example in which every worker shuffles the whole set on its own.
    """
    key = [seed, epoch] if stream < 0 else [seed, epoch, stream]
    return np.random.default_rng(key).permutation(num_examples)


def rank_batch_indices(order: np.ndarray, steps: int, per_rank_batch_size: int,
                       rank: int, size: int) -> np.ndarray:
    """Example indices of rank `rank`'s batches, shape (steps, per_rank_batch_size).

    Global batch t is order[t*G:(t+1)*G] with G = per_rank_batch_size * size;
    rank r takes every size-th element of it starting at r.
    """
    global_batch_size = per_rank_batch_size * size
    used = order[:steps * global_batch_size]
    if len(used) < steps * global_batch_size:
        raise ValueError(f"{steps} steps of {global_batch_size} need more than "
                         f"{len(order)} examples")
    return used[rank::size].reshape(steps, per_rank_batch_size)


def eval_indices(num_examples: int, rank: int, size: int) -> np.ndarray:
    """This rank's share of the test split; all ranks together cover it exactly once."""
    return np.arange(rank, num_examples, size, dtype=np.int64)
