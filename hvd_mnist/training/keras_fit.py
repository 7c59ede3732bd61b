"""The baseline: Horovod's Keras MNIST example in TF2 form (`--mode=keras`).

Horovod's DistributedOptimizer (around Adadelta(1.0 x size) by default), its
BroadcastGlobalVariablesCallback(0) and MetricAverageCallback(), a model file per epoch
and verbose output on rank 0 only, on Keras 2 and Keras 3 alike; the custom loop's hooks
(hooks.py) at fit's points do the rest. It
reads the same sharded batches, in the same order, as the custom loop, which is what
lets the parity tests compare the two weight for weight. `--keras_literal` reproduces
the example exactly instead: every worker reads the whole training set in its own
order, for ceil(epochs / size) epochs.
"""

import dataclasses
import functools
import math
import os
import time

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import tensorflow as tf

from hvd_mnist import config as config_lib
from hvd_mnist.data import splits
from hvd_mnist.outputs import files, records
from hvd_mnist.training import (communication, hooks as hooks_lib, job as job_lib,
                                model as model_lib, precision)
from hvd_mnist.worker import keras_compat, runtime


class RunHooksCallback(tf.keras.callbacks.Callback):
    """The loop's hooks (hooks.RunHooks: dropout's streams, clock, progress, TensorBoard,
    the epoch's line and save, the --target_accuracy stop) at fit's points, and each
    epoch's record. Must come after Horovod's MetricAverageCallback, so the val_* values it
    reads are already averaged over ranks."""

    def __init__(self, hooks: hooks_lib.RunHooks, job: job_lib.Job):
        super().__init__()
        self.hooks, self.steps = hooks, job.steps_per_epoch
        self.images_per_epoch = job.steps_per_epoch * job.batching.global_batch_size
        self.test_examples = job.source.num_test_examples
        self.history = []

    def on_epoch_begin(self, epoch, logs=None):
        self.hooks.start_epoch(hooks_lib.Epoch(epoch + 1, self.steps))
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        # fit's "loss" is this rank's running mean over the epoch; the monitor asks for
        # the sum only at --log_every points, where every rank is.
        # Horovod: the ranks' running means averaged, as the loop's step averages its loss.
        self.hooks.step_done(batch + 1, lambda: float(hvd.allreduce(
            tf.constant(logs["loss"] * (batch + 1)), op=hvd.Average, name="keras_loss_sum")))

    def on_test_begin(self, logs=None):
        # fit() validates inside the epoch; training time stops here.
        self._train_seconds = time.perf_counter() - self._start

    def on_epoch_end(self, epoch, logs=None):
        test_metrics = {"test_loss": float(logs["val_loss"]),
                        "test_accuracy": float(logs["val_accuracy"]),
                        "test_examples": self.test_examples}
        record = records.epoch_record(epoch + 1, float(logs["loss"]), test_metrics,
                                      train_seconds=self._train_seconds,
                                      images_trained=self.images_per_epoch)
        self.history.append(record)
        if self.hooks.end_epoch(record):
            self.model.stop_training = True


def save_on_chief(model, path_pattern: str):
    """save(epoch): Keras's model file on rank 0, as Horovod's example's ModelCheckpoint,
    but a failed save (disk full, permissions) stops every rank with one line instead of
    leaving the others waiting in the next allreduce."""

    def save(epoch: int) -> None:
        path = path_pattern.format(epoch=epoch)

        def write():
            with files.writing(path):
                model.save(path)

        runtime.on_chief(write)  # Horovod: rank 0 alone writes checkpoints

    return save


def fit_verbosity(progress_mode: str) -> int:
    """fit's live bar (1) for --progress=bar; otherwise one line per epoch (2): Keras's
    Progbar always redraws with carriage returns on Linux, terminal or not."""
    return 1 if progress_mode == "bar" else 2


def literal_epochs(epochs: int, size: int) -> int:
    """Horovod's example divides epochs by workers, each of which reads everything."""
    return math.ceil(epochs / size)


def train_batches(job: job_lib.Job, epochs: int, *, seed: int, keras_literal: bool):
    """Every epoch's batches for this rank, one after the other: fit() consumes one dataset."""
    batch = job.batching.per_rank_batch_size
    if keras_literal:  # --input=memory only (config.py's rules refuse the others)
        # The example's workers shuffle the whole set independently.
        split = job.source.train_split
        orders = [splits.epoch_permutation(seed, epoch, len(split),
                                         stream=job.topology.rank)[:job.steps_per_epoch * batch]
                  for epoch in range(1, epochs + 1)]
        return splits.batches_from_indices(split, np.concatenate(orders), batch, job.dtype)
    per_epoch = [job.source.train_batches(seed=seed, epoch=epoch,
                                          steps=job.steps_per_epoch, per_rank_batch_size=batch)
                 for epoch in range(1, epochs + 1)]
    return functools.reduce(lambda a, b: a.concatenate(b), per_epoch)


def validation_batches(job: job_lib.Job, *, keras_literal: bool):
    batch = job.batching.per_rank_batch_size
    if keras_literal:  # every worker validates on the whole test split
        split = job.source.test_split
        return splits.batches_from_indices(split, np.arange(len(split)), batch, job.dtype)
    return job.source.eval_batches(batch)


def literal_job(job: job_lib.Job, *, max_steps_per_epoch: int,
                backward_passes_per_step: int) -> job_lib.Job:
    """Every worker steps through the whole training set each epoch."""
    steps = config_lib.resolve_steps_per_epoch(len(job.source.train_split),
                                               job.batching.per_rank_batch_size,
                                               max_steps_per_epoch, backward_passes_per_step)
    return dataclasses.replace(job, steps_per_epoch=steps)


def distributed_optimizer(config: config_lib.TrainConfig, job: job_lib.Job):
    """The run's optimizer (Adadelta(1.0 x size) by default) in Horovod's
    DistributedOptimizer, loss-scaled for mixed_float16 (keras_compat.loss_scaled)."""
    optimizer_class, arguments = model_lib.optimizer_recipe(
        config.optimizer, job_lib.learning_rate(config, job))

    def wrap_distributed(optimizer):
        # Horovod: the optimizer averages the ranks' gradients before each update; with
        # --backward_passes_per_step=K, once per K batches, their mean (as the custom loop).
        return hvd_keras.DistributedOptimizer(
            optimizer, compression=communication.compression(config.fp16_allreduce),
            backward_passes_per_step=config.backward_passes_per_step,
            average_aggregated_gradients=True)

    optimizer = optimizer_class(**arguments)
    if precision.loss_scaling(config.precision):
        return keras_compat.loss_scaled(wrap_distributed, optimizer)
    return wrap_distributed(optimizer)


def train_and_evaluate(config: config_lib.TrainConfig) -> dict:
    wall_start = time.perf_counter()
    job = job_lib.start(config)
    size = job.topology.size
    epochs = config.epochs
    if config.keras_literal:
        job = literal_job(job, max_steps_per_epoch=config.max_steps_per_epoch,
                          backward_passes_per_step=config.backward_passes_per_step)
        epochs = literal_epochs(config.epochs, size)

    # The same seed on every rank: the same initial weights, which Horovod's broadcast
    # callback then only confirms (it runs after the first batch).
    tf.keras.utils.set_random_seed(config.seed)
    model = model_lib.build_model(dropout=config.dropout, precision=config.precision)
    optimizer = distributed_optimizer(config, job)
    # No XLA: Keras 3 would compile fit's step with it on GPU hosts, and Horovod's ops
    # do not run inside XLA-compiled functions (on CPU it was 8x slower anyway).
    model.compile(loss=model_lib.make_loss(), optimizer=optimizer, metrics=["accuracy"],
                  jit_compile=False)

    batch = job.batching.per_rank_batch_size
    hooks = hooks_lib.for_run(
        config, model, optimizer, epochs=epochs, steps_per_epoch=job.steps_per_epoch,
        batching=job.batching, rank=job.topology.rank, draw_bar=False,
        save=save_on_chief(model, os.path.join(
            config.model_dir, "checkpoint-{epoch}" + keras_compat.model_file_suffix())))
    run_hooks = RunHooksCallback(hooks, job)
    callbacks = [
        # Horovod: rank 0's weights and optimizer state on every rank after the first
        # batch; each rank keeps its own dropout stream (RunHooks reseeds it).
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(
            0, local_variables=keras_compat.dropout_streams(model)),
        # Horovod: each epoch's metrics averaged over ranks, before anything reads them.
        hvd_keras.callbacks.MetricAverageCallback(),
        run_hooks,
    ]
    runtime.on_chief(lambda: records.record_start(config, size, resumed_after_epoch=None))
    runtime.log(f"keras fit on {size} worker(s): {job.steps_per_epoch} steps/epoch of "
                f"{batch} images per worker, {epochs} epochs"
                + (" (literal Horovod example)" if config.keras_literal else ""))
    # shuffle=False: the batches come shuffled per rank and epoch; fit cannot shuffle a
    # dataset, and on Keras 3 says so in a warning from every rank.
    model.fit(train_batches(job, epochs, seed=config.seed, keras_literal=config.keras_literal),
              epochs=epochs, shuffle=False, steps_per_epoch=job.steps_per_epoch,
              validation_data=validation_batches(job, keras_literal=config.keras_literal),
              callbacks=callbacks,
              verbose=fit_verbosity(hooks.monitor.mode) if runtime.is_chief() else 0)

    summary = records.summarize(job, run_hooks.history, first_epoch=1,
                                wall_seconds=time.perf_counter() - wall_start,
                                clock=hooks.clock, mode="keras")
    hooks.close()
    job_lib.finish(summary, model, optimizer, model_dir=config.model_dir,
                   export=config.export)
    return summary
