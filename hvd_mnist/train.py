"""The custom training loop: Horovod's DistributedGradientTape in a tf.function.

Pieces, each on its own: `make_train_step` (one optimisation step, nothing
else), `make_eval_step`, `sum_across_ranks` (the one place metrics are
reduced), `evaluate`, `train_epoch` (one epoch's steps and loss checks), and
`train_and_evaluate` (the run: epochs, evaluation, checkpoints).
"""

import math
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_mnist import (checkpoint, communication, config as config_lib, job as job_lib,
                       keras_compat, model as model_lib, progress, run_identity, runtime, timing)
from hvd_mnist.errors import CollectiveError

LABEL_SPEC = tf.TensorSpec([None], tf.int64)


def image_spec(model) -> tf.TensorSpec:
    """A batch of the model's inputs: any batch size, so the short last batch does not retrace."""
    return tf.TensorSpec([None, *model_lib.INPUT_SHAPE], model.inputs[0].dtype)


def make_train_step(model, optimizer, loss_fn, compression=hvd.Compression.none,
                    input_signature=None):
    """One step: local gradients, averaged over ranks by Horovod, then applied.

    Returns the loss averaged over ranks, so every rank sees the same value and
    takes the same decision about it. (What that scalar allreduce costs is below
    the run-to-run noise here, and riding it on the gradients' allreduce was no
    faster: README, Performance.) Autograph is off: the step has no Python control flow on tensors, and
    converting Keras's and Horovod's code took a second of tracing in every process.
    """

    sources = keras_compat.tf_variables(model.trainable_variables)  # what Horovod accepts

    @tf.function(input_signature=input_signature or [image_spec(model), LABEL_SPEC],
                 autograph=False)
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            probabilities = model(images, training=True)
            loss = loss_fn(labels, probabilities)
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(loss, sources)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return hvd.allreduce(loss, op=hvd.Average, name="train_loss")

    return train_step


def train_step_for(config: config_lib.TrainConfig, model, optimizer):
    """The run's step: plain, or accumulating `--backward_passes_per_step` batches per update;
    gradients sent as float16 with `--fp16_allreduce` (communication.py)."""
    compression = communication.compression(config)
    if config.backward_passes_per_step > 1:
        return communication.make_accumulating_train_step(
            model, optimizer, model_lib.make_loss(), config.backward_passes_per_step,
            compression, [image_spec(model), LABEL_SPEC])
    return make_train_step(model, optimizer, model_lib.make_loss(), compression)


def make_eval_step(model):
    """Summed loss and number of correct predictions of one batch (no averaging)."""

    @tf.function(input_signature=[image_spec(model), LABEL_SPEC], autograph=False)
    def eval_step(images, labels):
        probabilities = model(images, training=False)
        losses = tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities)
        correct = tf.equal(tf.argmax(probabilities, axis=1), labels)
        return tf.reduce_sum(losses), tf.reduce_sum(tf.cast(correct, tf.float32))

    return eval_step


def sum_across_ranks(values) -> np.ndarray:
    """Element-wise sum over all ranks, in float64 so counts stay exact."""
    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum,
                         name="metric_sums").numpy()


def evaluate(eval_step, dataset) -> dict:
    """Loss and accuracy over every rank's share of the test set together."""
    loss_sum = correct = examples = 0.0
    for images, labels in dataset:
        batch_loss, batch_correct = eval_step(images, labels)
        loss_sum += float(batch_loss)
        correct += float(batch_correct)
        examples += int(labels.shape[0])
    loss_sum, correct, examples = sum_across_ranks([loss_sum, correct, examples])
    return {"test_loss": loss_sum / examples, "test_accuracy": correct / examples,
            "test_examples": int(examples)}


def check_finite(loss: float, where: str) -> None:
    """`loss` is averaged over ranks, so every rank stops at the same step."""
    if not math.isfinite(loss):
        raise CollectiveError(f"training diverged: loss is {loss} at {where}; lower "
                              "--learning_rate or check the input data")


def inject_nan(model) -> None:
    """Testing aid: divergence as it looks in practice, NaN weights, here on one rank.

    (NaN pixels are not enough: max pooling discards NaN, and the loss stayed finite.)
    """
    bias = model.layers[-1].bias
    bias.assign(tf.fill(bias.shape, math.nan))


class DeferredLossCheck:
    """Checks each step's loss one step late.

    Reading the loss of the step just started would make the host wait for it
    (on a GPU, a stall); the previous step's loss is ready by then.
    """

    def __init__(self):
        self._loss, self._where = None, ""

    def push(self, loss, where: str) -> None:
        self.flush()
        self._loss, self._where = loss, where

    def flush(self) -> None:
        if self._loss is not None:
            check_finite(float(self._loss), self._where)
            self._loss = None


def train_epoch(config: config_lib.TrainConfig, train_step, batches, *, epoch: int,
                steps: int, model, clock: timing.StepClock, after_step=None,
                monitor: progress.TrainingMonitor | None = None) -> float:
    """One epoch's steps over `batches`; returns their mean loss, every one checked finite.

    `after_step(step, loss)`, if given, runs after each step (elastic.py commits there).
    `monitor` shows progress and, every --log_every steps, logs to TensorBoard; without
    one (elastic.py), a loss line every --log_every steps.
    """
    loss_total = 0.0  # becomes a tensor at the first step: summed on the device, read once
    finite_check = DeferredLossCheck()
    for step, (images, labels) in enumerate(batches, start=1):
        run_step = (epoch - 1) * steps + step
        if run_step == config.inject_nan_at_step and runtime.is_chief():
            inject_nan(model)
        loss = train_step(images, labels)
        clock.step_done()
        finite_check.push(loss, f"step {run_step} (epoch {epoch}, step {step} of {steps})")
        loss_total += loss
        if monitor is not None:
            monitor.step_done(step, lambda: float(loss_total))
        elif config.log_every and step % config.log_every == 0:
            runtime.log(f"epoch {epoch} step {step}/{steps} loss {float(loss):.4f}")
        if after_step:
            after_step(step, loss)
    finite_check.flush()  # before any checkpoint of this epoch
    return float(loss_total) / steps


def train_and_evaluate(config: config_lib.TrainConfig) -> dict:
    """Trains with the custom loop on every rank; returns the run's summary."""
    wall_start = time.perf_counter()
    job = job_lib.start(config)
    topology, batching, steps = job.topology, job.batching, job.steps_per_epoch

    tf.keras.utils.set_random_seed(config.seed)
    model = model_lib.build_model(dropout=config.dropout, dtype=job.dtype)
    optimizer = job_lib.scheduled_optimizer(config, job)
    # Creating the optimizer's slots now (Horovod's examples let the first step
    # create them) means rank 0's full state, fresh or restored, can be
    # broadcast before step 1, so even the first gradients come from identical
    # weights on every rank.
    optimizer.build(model.trainable_variables)
    run = run_identity.of_run(config, batching, topology.size, steps, model, optimizer)
    store = checkpoint.CheckpointStore(config.model_dir, model, optimizer,
                                       config.keep_checkpoints, run)
    restored = runtime.on_chief(
        lambda: store.restore_latest() if config.resume else checkpoint.Restored(0))
    hvd.broadcast_variables(keras_compat.state_variables(model, optimizer), root_rank=0)
    epochs_done = restored.epoch
    runtime.on_chief(lambda: job_lib.record_start(
        config, topology.size, resumed_after_epoch=epochs_done if config.resume else None))
    if config.resume:
        runtime.log(f"resuming after epoch {epochs_done} from {restored.path}" if epochs_done
                    else f"--resume: no checkpoint in {store.directory}, starting fresh")
        if restored.changes:
            runtime.log(restored.changes)

    train_step = train_step_for(config, model, optimizer)
    eval_step = make_eval_step(model)
    eval_batches = job.source.eval_batches(batching.per_rank_batch_size)
    runtime.log(f"training on {topology.size} worker(s): {steps} steps/epoch of "
                f"{batching.global_batch_size} images ({batching.per_rank_batch_size} per "
                f"worker), {config.optimizer} learning rate {batching.learning_rate:g}, "
                f"epochs {epochs_done + 1}..{config.epochs}")

    history, clock = [], timing.StepClock(batching.global_batch_size)
    monitor = progress.monitor_for_run(config, epochs=config.epochs, steps_per_epoch=steps,
                                       images_per_step=batching.global_batch_size,
                                       learning_rate=lambda: float(optimizer.learning_rate))
    for epoch in range(epochs_done + 1, config.epochs + 1):
        # Masks differ per rank, as they would on separate machines, and depend
        # only on (seed, rank, epoch, step), so a resumed run draws the same ones.
        model_lib.reseed_dropout(model, (config.seed, topology.rank, epoch))
        batches = job.source.train_batches(seed=config.seed, epoch=epoch, steps=steps,
                                           per_rank_batch_size=batching.per_rank_batch_size)
        epoch_start = time.perf_counter()
        clock.epoch_started()
        monitor.start_epoch(epoch)
        train_loss = train_epoch(config, train_step, batches, epoch=epoch, steps=steps,
                                 model=model, clock=clock, monitor=monitor)
        record = job_lib.epoch_record(
            epoch, train_loss, evaluate(eval_step, eval_batches),
            train_seconds=time.perf_counter() - epoch_start,
            images_trained=steps * batching.global_batch_size)
        history.append(record)
        monitor.end_epoch(record)
        runtime.on_chief(lambda: store.save(epoch))
        if job_lib.end_epoch(config, record, config.epochs):
            break

    if config.export_weights_dir:
        job_lib.export_weights(config.export_weights_dir, model, topology.rank)
    summary = job_lib.summarize(job, history, first_epoch=epochs_done + 1,
                                wall_seconds=time.perf_counter() - wall_start, clock=clock,
                                mode="custom",
                                train_step_traces=train_step.experimental_get_tracing_count())
    monitor.close()
    job_lib.finish(config, summary, model)
    return summary
