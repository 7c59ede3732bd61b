"""Testing aids that ship with the product: how tests make a run fail, or look inside it.

One policy for all of them: their flags are defined here, not in main.py, so
`--help` (main.py's flags) leaves them out and `--helpfull` lists them; the
product calls into this module at the one point each aid needs. Faults the
product must survive from outside (a full disk, a killed worker) are made by
the tests themselves (tests/with_fault.py, tests/test_elastic.py).
"""

import hashlib
import json
import math
import os
import time

from absl import flags

# TensorFlow, numpy and Horovod are imported where used: main.py defines these flags
# before anything loads TensorFlow.


def define_flags():
    flags.DEFINE_integer("inject_nan_at_step", 0, "Testing aid: set rank 0's output bias to "
                         "NaN before this step (counted from 1 over the run) to see training "
                         "stop.", lower_bound=0)
    flags.DEFINE_integer("inject_overflow_at_step", 0, "Testing aid: the last rank's gradients "
                         "become Inf before the allreduce of this step (counted from 1 over the "
                         "run; 2 or more workers), as a float16 overflow on one rank would.",
                         lower_bound=0)
    flags.DEFINE_string("export_weights_dir", "", "Testing aid: every rank writes its final "
                        "weights there as weights_rank<R>.npz, and its optimizer's variables "
                        "as optimizer_rank<R>.npz.")
    flags.DEFINE_string("example_log", "", "Testing aid for --elastic: every process appends "
                        "the examples of each step it trains to DIR/examples-<pid>.jsonl.")
    flags.register_multi_flags_validator(
        ["elastic", "example_log"], lambda f: f["elastic"] or not f["example_log"],
        message="--example_log needs --elastic")


def inject_nan_if_due(config, run_step: int, model) -> None:
    """--inject_nan_at_step: divergence as it looks in practice, NaN weights, on rank 0.

    (NaN pixels are not enough: max pooling discards NaN, and the loss stayed finite.)
    """
    from hvd_mnist.process import runtime
    import tensorflow as tf
    if run_step == config.inject_nan_at_step and runtime.is_chief():
        bias = model.layers[-1].bias
        bias.assign(tf.fill(bias.shape, math.nan))


class _OverflowOnOneRank:
    """A Horovod compression that hands tensors to `inner`, but while `armed` (set on the
    last rank only, by arm_overflow_if_due) replaces them with Inf first: one rank's
    gradients overflowed, as its float16 backward pass can, on their way into the allreduce."""

    def __init__(self, inner):
        import tensorflow as tf
        self.inner = inner
        self.armed = tf.Variable(False, trainable=False, name="inject_overflow")

    def compress(self, tensor):
        import tensorflow as tf
        overflowed = tf.fill(tf.shape(tensor), tf.constant(math.inf, tensor.dtype))
        return self.inner.compress(tf.where(self.armed, overflowed, tensor))

    def decompress(self, tensor, ctx):
        return self.inner.decompress(tensor, ctx)


_overflow = None


def overflow_compression(config, compression):
    """--inject_overflow_at_step: `compression`, able to overflow one rank's gradients."""
    global _overflow
    if not config.inject_overflow_at_step:
        return compression
    _overflow = _OverflowOnOneRank(compression)
    return _overflow


def arm_overflow_if_due(config, run_step: int) -> None:
    """Before each step (both paths): arms the overflow for step --inject_overflow_at_step
    on the last rank, and disarms it after."""
    if _overflow is None:
        return
    import horovod.tensorflow as hvd
    _overflow.armed.assign(run_step == config.inject_overflow_at_step
                           and hvd.rank() == hvd.size() - 1)


def write_weights(config, model, optimizer) -> None:
    """--export_weights_dir: every rank writes its own weights, so tests compare ranks and
    runs, and its optimizer's step count and loss scale (NaN without loss scaling)."""
    if not config.export_weights_dir:
        return
    import horovod.tensorflow as hvd
    import numpy as np
    from hvd_mnist.process import keras_compat
    os.makedirs(config.export_weights_dir, exist_ok=True)
    np.savez(os.path.join(config.export_weights_dir, f"weights_rank{hvd.rank()}.npz"),
             *[v.numpy() for v in model.weights])
    scale = keras_compat.loss_scale(optimizer)
    np.savez(os.path.join(config.export_weights_dir, f"optimizer_rank{hvd.rank()}.npz"),
             iterations=int(optimizer.iterations),
             loss_scale=math.nan if scale is None else scale)


class ExampleLog:
    """--example_log: one JSON line per event, per process, flushed at once so a
    SIGKILLed process's lines up to its death are kept."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self._file = open(os.path.join(directory, f"examples-{os.getpid()}.jsonl"), "a",
                          buffering=1)

    def write(self, **record) -> None:
        self._file.write(json.dumps({**record, "unix_time": time.time()}) + "\n")


def example_log_for(config) -> ExampleLog | None:
    return ExampleLog(config.example_log) if config.example_log else None


def weights_digest(variables) -> str:
    """What --example_log records of the weights a (re)start begins from."""
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()
