"""Test-only launcher: hvd_mnist.main with the testing aids, which are flags of this script.

    horovodrun -np 2 python tests/with_aids.py [aid flags] [hvd_mnist.main flags]

  --inject_nan_at_step=K       rank 0's output bias becomes NaN before its K-th training
                               step (counted from 1 in the process), to see training stop
  --inject_overflow_at_step=K  the last rank's gradients become Inf on their way into the
                               allreduce of its K-th step (2 or more workers), as a float16
                               overflow on one rank would
  --export_weights_dir=DIR     every rank writes its final weights as weights_rank<R>.npz,
                               and its optimizer's step count and loss scale (NaN without
                               loss scaling) as optimizer_rank<R>.npz
  --example_log=DIR            (--elastic) every process appends each start, each step's
                               examples and each commit to DIR/examples-<pid>.jsonl

Each aid wraps the product function where it acts, after the flags are parsed, so the
product has no flag, config field or branch for any of them. tests/with_fault.py and
tests/broken_trainer.py start through `run()` here, so their jobs take these flags too.
"""

import os
import sys

# This checkout's hvd_mnist, as `python -m hvd_mnist.main` from its root would import it
# (a script's own directory, tests/, is what Python puts first on the path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402

from hvd_mnist import main, train_flags  # noqa: E402  (main quiets TensorFlow first)
from hvd_mnist.verification.gpus import weights_digest  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
    """hvd_mnist.main's flags, then the aids'."""
    train_flags.define_flags()
    flags.DEFINE_integer("inject_nan_at_step", 0, "Rank 0's output bias becomes NaN before "
                         "its K-th training step (counted from 1).", lower_bound=0)
    flags.DEFINE_integer("inject_overflow_at_step", 0, "The last rank's gradients become Inf "
                         "on their way into the allreduce of its K-th step (counted from 1; "
                         "2 or more workers).", lower_bound=0)
    flags.DEFINE_string("export_weights_dir", "", "Every rank writes its final weights there "
                        "as weights_rank<R>.npz, and its optimizer's as optimizer_rank<R>.npz.")
    flags.DEFINE_string("example_log", "", "With --elastic: every process appends its starts, "
                        "the examples of each step and its commits to DIR/examples-<pid>.jsonl.")
    flags.register_multi_flags_validator(
        ["elastic", "example_log"], lambda f: f["elastic"] or not f["example_log"],
        message="--example_log needs --elastic")


# ---------------------------------------------------------------- the steps

def around_each_step(before):
    """Every training step the run builds (step.train_step_for: the custom loop's and the
    elastic trainer's) calls before(n, model) first, n counting its calls from 1."""
    from hvd_mnist.training import step as step_lib
    train_step_for = step_lib.train_step_for

    def train_step_for_with_hook(model, optimizer, **settings):
        train_step = train_step_for(model, optimizer, **settings)
        calls = [0]

        def hooked_train_step(images, labels):
            calls[0] += 1
            before(calls[0], model)
            return train_step(images, labels)

        hooked_train_step.experimental_get_tracing_count = \
            train_step.experimental_get_tracing_count
        return hooked_train_step

    step_lib.train_step_for = train_step_for_with_hook


def before_each_fit_batch(before):
    """fit() (--mode=keras) calls before(n) ahead of each batch, n counting them from 1."""
    import tensorflow as tf

    class BeforeEachBatch(tf.keras.callbacks.Callback):
        batches = 0

        def on_train_batch_begin(self, batch, logs=None):
            self.batches += 1
            before(self.batches)

    fit = tf.keras.Model.fit

    def fit_with_callback(model, *args, callbacks=None, **kwargs):
        return fit(model, *args, callbacks=[*(callbacks or []), BeforeEachBatch()], **kwargs)

    tf.keras.Model.fit = fit_with_callback


def inject_nan_at_step(step_number):
    """Divergence as it looks in practice, NaN weights, on rank 0. (NaN pixels are not
    enough: max pooling discards NaN, and the loss stayed finite.)"""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    def poison(calls, model):
        if calls == step_number and hvd.rank() == 0:
            bias = model.layers[-1].bias
            bias.assign(tf.fill(bias.shape, math.nan))

    around_each_step(poison)


class OverflowOnOneRank:
    """A Horovod compression that hands tensors to `inner`, but while `armed` replaces them
    with Inf first: one rank's gradients overflowed, as its float16 backward pass can, on
    their way into the allreduce."""

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


def inject_overflow_at_step(step_number):
    """Both paths take their compression from communication.compression; it is armed on
    the last rank before step `step_number`, and disarmed before the next."""
    import horovod.tensorflow as hvd
    from hvd_mnist.training import communication
    compression = communication.compression
    overflows = []

    def overflowing_compression(fp16_allreduce):
        overflows.append(OverflowOnOneRank(compression(fp16_allreduce)))
        return overflows[-1]

    def arm(calls, model=None):
        for overflow in overflows:
            overflow.armed.assign(calls == step_number and hvd.rank() == hvd.size() - 1)

    communication.compression = overflowing_compression
    around_each_step(arm)
    before_each_fit_batch(arm)


# ---------------------------------------------------------------- what a run leaves

def export_weights_dir(directory):
    """Every rank writes its own weights at the end (job.finish, on every path), so tests
    compare ranks and runs, and its optimizer's step count and loss scale."""
    import horovod.tensorflow as hvd
    import numpy as np
    from hvd_mnist.worker import keras_compat
    from hvd_mnist.training import job as job_lib
    finish = job_lib.finish

    def finish_writing_weights(summary, model, optimizer, **settings):
        os.makedirs(directory, exist_ok=True)
        np.savez(os.path.join(directory, f"weights_rank{hvd.rank()}.npz"),
                 *[v.numpy() for v in model.weights])
        scale = keras_compat.loss_scale(optimizer)
        np.savez(os.path.join(directory, f"optimizer_rank{hvd.rank()}.npz"),
                 iterations=int(optimizer.iterations),
                 loss_scale=math.nan if scale is None else scale)
        return finish(summary, model, optimizer, **settings)

    job_lib.finish = finish_writing_weights


class ExampleLog:
    """One JSON line per event, per process, flushed at once so a SIGKILLed process's
    lines up to its death are kept."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self._file = open(os.path.join(directory, f"examples-{os.getpid()}.jsonl"), "a",
                          buffering=1)

    def write(self, **record) -> None:
        self._file.write(json.dumps({**record, "unix_time": time.time()}) + "\n")


def example_log(directory):
    """The elastic trainer's starts (after each sync: where it goes on from, and a digest
    of the weights), steps (the examples this rank trains) and commits inside an epoch."""
    import horovod.tensorflow as hvd
    from hvd_mnist.data import resharding
    from hvd_mnist.training import elastic, elastic_state
    log = ExampleLog(directory)
    run = {}  # the batches of the epoch's rest

    def where(state):
        return {"rank": hvd.rank(), "size": hvd.size(), "epoch": state.epoch}

    train = elastic._train

    def logged_train(state, *args):
        # The host too: the driver's first rank order is not the hosts file's (it orders
        # hosts as a Python set does), so a test removing a worker's host must look it up.
        log.write(start=state.starts + 1, **where(state),
                  host=os.environ.get("HOROVOD_HOSTNAME"), position=state.position,
                  weights=weights_digest(state.variables))
        return train(state, *args)

    rest_of_epoch = resharding.rest_of_epoch

    def remembered_rest_of_epoch(*args, **kwargs):
        run["batches"], step_examples = rest_of_epoch(*args, **kwargs)
        return run["batches"], step_examples

    after_step = elastic.Commits.after_step

    def logged_after_step(commits, epoch, step, agreed):
        state = commits.state  # before the step's examples count as done
        log.write(step=state.starts, **where(state), position=state.position,
                  examples=run["batches"][step - commits.first_step].tolist())
        return after_step(commits, epoch, step, agreed)

    commit = elastic_state.TrainingState.commit

    def logged_commit(state):
        commit(state)
        if state.position:  # inside an epoch; the commit at an epoch's end has position 0
            log.write(commit=state.starts, **where(state), position=state.position)

    elastic._train = logged_train
    resharding.rest_of_epoch = remembered_rest_of_epoch
    elastic.Commits.after_step = logged_after_step
    elastic_state.TrainingState.commit = logged_commit


# ---------------------------------------------------------------- the launcher

def install(flag_values):
    """The aids the flags ask for."""
    if flag_values.inject_nan_at_step:
        inject_nan_at_step(flag_values.inject_nan_at_step)
    if flag_values.inject_overflow_at_step:
        inject_overflow_at_step(flag_values.inject_overflow_at_step)
    if flag_values.export_weights_dir:
        export_weights_dir(flag_values.export_weights_dir)
    if flag_values.example_log:
        example_log(flag_values.example_log)


def main_with_aids(argv):
    install(FLAGS)
    return main.main(argv)


def run():
    define_flags()
    app.run(main_with_aids)


if __name__ == "__main__":
    run()
