"""The trainer with one deliberate bug, to prove that the parity checks can fail.

    horovodrun -np 2 python tests/broken_trainer.py BUG [flags]

BUG is sum_gradients, local_gradients or no_sharding; the run starts through
tests/with_aids.py, so the testing aids' flags work here too.

The gradient bugs are planted on both paths (--mode=custom and --mode=keras), on Keras 2
and Keras 3 alike, at the seams where each path averages.
"""

import functools
import sys

import with_aids  # first: this checkout's hvd_mnist, TensorFlow quiet

import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvd_keras  # noqa: E402

from hvd_mnist.data import splits  # noqa: E402


def sum_gradients():
    """Sum instead of average the ranks' gradients: a size-times larger step."""
    hvd.DistributedGradientTape = functools.partial(hvd.DistributedGradientTape, op=hvd.Sum)
    grouped_allreduce = hvd.grouped_allreduce  # the custom loop's accumulating step calls it
    hvd.grouped_allreduce = lambda tensors, op=None, **kwargs: grouped_allreduce(
        tensors, op=hvd.Sum, **kwargs)
    hvd_keras.DistributedOptimizer = functools.partial(hvd_keras.DistributedOptimizer,
                                                       op=hvd.Sum)


def local_gradients():
    """No averaging at all: every rank steps on its own gradients, and the ranks drift apart."""
    hvd.DistributedGradientTape = lambda tape, **kwargs: tape
    hvd_keras.DistributedOptimizer = lambda optimizer, **kwargs: optimizer


def no_sharding():
    """Every rank trains on rank 0's share: half the global batch, seen twice."""
    correct = splits.rank_batch_indices
    splits.rank_batch_indices = lambda order, steps, batch, rank, size: correct(
        order, steps, batch, 0, size)


if __name__ == "__main__":
    {"sum_gradients": sum_gradients, "local_gradients": local_gradients,
     "no_sharding": no_sharding}[sys.argv.pop(1)]()
    with_aids.run()
