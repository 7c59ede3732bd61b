"""The trainer with one deliberate bug, to prove that the parity checks can fail.

    horovodrun -np 2 python tests/broken_trainer.py {sum_gradients|no_sharding} [flags]
"""

import functools
import sys

import horovod.tensorflow as hvd

from hvd_mnist import data, main


def sum_gradients():
    """Sum instead of average the ranks' gradients: a size-times larger step."""
    hvd.DistributedGradientTape = functools.partial(hvd.DistributedGradientTape, op=hvd.Sum)


def no_sharding():
    """Every rank trains on rank 0's share: half the global batch, seen twice."""
    correct = data.rank_batch_indices
    data.rank_batch_indices = lambda order, steps, batch, rank, size: correct(
        order, steps, batch, 0, size)


if __name__ == "__main__":
    {"sum_gradients": sum_gradients, "no_sharding": no_sharding}[sys.argv.pop(1)]()
    main.run()
