"""The loop: one epoch's steps, then its evaluation and end, for the custom and the elastic
trainer; and the custom trainer's run (`train_and_evaluate`).

`Loop.train` runs steps and checks their loss; around each step it calls the run's
`control` (preemption.StepControl: stop or checkpoint at a step all ranks agree on;
elastic.py's commits) and its hooks (hooks.py). `Loop.end_epoch` evaluates and ends the
epoch. The run: start (job.py), rank 0's state on every rank before step 1, the epochs,
and what the run leaves (job.finish). elastic.py runs the same `Loop` under
hvd.elastic.run.
"""

import time

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_mnist import config as config_lib
from hvd_mnist.outputs import checkpoint, records, run_identity
from hvd_mnist.training import (hooks as hooks_lib, job as job_lib, model as model_lib,
                                preemption, step as step_lib)
from hvd_mnist.worker import keras_compat, runtime


class Loop:
    """The steps and epoch ends of one run (or elastic start)."""

    def __init__(self, train_step, eval_step, eval_batches, hooks: hooks_lib.RunHooks):
        self.train_step, self.eval_step, self.eval_batches = train_step, eval_step, eval_batches
        self.hooks = hooks

    def train(self, batches, epoch: hooks_lib.Epoch, control) -> float:
        """Steps `epoch.first_step`..`epoch.steps` over `batches`; returns the epoch's mean
        loss, every loss checked finite.

        `control` before each step and after it decides whether to save (flushing the loss
        check first: nothing non-finite is ever saved) and whether to stop; with
        `control.requests`, the step carries them and returns (loss, agreed requests).
        """
        loss_total = 0.0  # becomes a tensor at the first step: summed on the device, read once
        finite_check = step_lib.DeferredLossCheck()

        def act(decision, step):
            if decision.save:
                finite_check.flush()
                control.save(epoch.number, step, epoch.loss_before + float(loss_total),
                             decision.stop)

        self.hooks.start_epoch(epoch)
        for step, (images, labels) in enumerate(batches, start=epoch.first_step):
            control.before_step()
            if control.requests is None:
                loss, agreed = self.train_step(images, labels), None
            else:
                loss, agreed = self.train_step(images, labels)
            finite_check.push(loss, f"step {epoch.run_steps_before + step} (epoch "
                                    f"{epoch.number}, step {step} of {epoch.steps})")
            loss_total += loss
            self.hooks.step_done(step, lambda: float(loss_total))
            act(control.after_step(epoch.number, step, agreed), step)
        finite_check.flush()  # before any checkpoint of this epoch
        act(control.at_epoch_end(epoch.number), epoch.steps)
        return (epoch.loss_before + float(loss_total)) / epoch.steps

    def end_epoch(self, epoch: int, train_loss: float, *, train_seconds: float,
                  images_trained: int) -> tuple[dict, bool]:
        """The epoch evaluated and ended (hooks.RunHooks.end_epoch); returns its record and
        whether the run stops here."""
        record = records.epoch_record(
            epoch, train_loss, step_lib.evaluate(self.eval_step, self.eval_batches),
            train_seconds=train_seconds, images_trained=images_trained)
        return record, self.hooks.end_epoch(record)


def restore_and_broadcast(config: config_lib.TrainConfig, store: checkpoint.CheckpointStore,
                          model, optimizer) -> checkpoint.Restored:
    """Rank 0's state, fresh or restored with --resume, on every rank; returns where the
    run is (rank 0's Restored, on every rank).

    The optimizer's slots exist by now (train_and_evaluate builds them), so this one
    broadcast, before step 1, covers the full state. Horovod's examples broadcast
    after the first step instead, because only that step creates the slots; their
    step 1 averages gradients taken at different weights on each rank.
    """
    restored = runtime.on_chief(
        lambda: store.restore_latest() if config.resume else checkpoint.Restored(0))
    # Horovod: rank 0's weights and optimizer state (slots, step count) on every rank.
    hvd.broadcast_variables(keras_compat.state_variables(model, optimizer), root_rank=0)
    runtime.on_chief(lambda: records.record_start(
        config, hvd.size(), resumed_after_epoch=restored.epoch if config.resume else None))
    log_resume(config.resume, restored, store)
    return restored


def log_resume(resume: bool, restored: checkpoint.Restored,
               store: checkpoint.CheckpointStore) -> None:
    if resume:
        where = (f"at step {restored.steps_done + 1} of epoch {restored.epoch + 1}"
                 if restored.steps_done else f"after epoch {restored.epoch}")
        runtime.log(f"resuming {where} from {restored.path}" if restored.path else
                    f"--resume: no checkpoint in {store.directory}, starting fresh")
        if restored.changes:
            runtime.log(restored.changes)


def train_and_evaluate(config: config_lib.TrainConfig) -> dict:
    """Trains with the custom loop on every rank; returns the run's summary.

    Raises preemption.Stopped after a SIGTERM or SIGINT, once the checkpoint is saved.
    """
    signals = preemption.StopSignals().install()
    try:
        summary = _train(config, signals)
    except preemption.Stopped:
        raise  # still handled until main.py exits: a second SIGTERM must not cut its line
    except BaseException:
        signals.uninstall()
        raise
    signals.uninstall()
    return summary


def _train(config: config_lib.TrainConfig, signals: preemption.StopSignals) -> dict:
    wall_start = time.perf_counter()
    job = job_lib.start(config)
    topology, batching, steps = job.topology, job.batching, job.steps_per_epoch

    tf.keras.utils.set_random_seed(config.seed)
    model = model_lib.build_model(dropout=config.dropout, precision=config.precision)
    optimizer = job_lib.scheduled_optimizer(config, job)
    optimizer.build(model.trainable_variables)  # the slots, before the broadcast
    identity = run_identity.of_run(config, batching, topology.size, steps, model, optimizer)
    store = checkpoint.CheckpointStore(config.model_dir, model, optimizer,
                                       config.keep_checkpoints, identity)
    restored = restore_and_broadcast(config, store, model, optimizer)
    start = restored.position

    control = preemption.control_for_run(
        store, signals, steps_per_epoch=steps, every_steps=config.checkpoint_every_steps,
        every_minutes=config.checkpoint_every_minutes,
        passes_per_update=config.backward_passes_per_step)

    def save(epoch):
        runtime.on_chief(lambda: store.save(epoch))  # Horovod: rank 0 alone writes checkpoints
        control.checkpoint_written()

    hooks = hooks_lib.for_run(config, model, optimizer, epochs=config.epochs,
                              steps_per_epoch=steps, batching=batching, rank=topology.rank,
                              save=save)
    train_step = step_lib.train_step_for(
        model, optimizer, backward_passes_per_step=config.backward_passes_per_step,
        fp16_allreduce=config.fp16_allreduce, requests=control.requests)
    loop = Loop(train_step, step_lib.make_eval_step(model),
                job.source.eval_batches(batching.per_rank_batch_size), hooks)
    runtime.log(f"training on {topology.size} worker(s): {steps} steps/epoch of "
                f"{batching.global_batch_size} images ({batching.per_rank_batch_size} per "
                f"worker), {config.optimizer} learning rate {batching.learning_rate:g}, "
                f"epochs {start.first_epoch}..{config.epochs}")

    history = []
    for number in range(start.first_epoch, config.epochs + 1):
        resumed = number == start.first_epoch
        epoch = hooks_lib.Epoch(number, steps, first_step=start.first_step if resumed else 1,
                                loss_before=restored.loss_sum if resumed else 0.0)
        batches = job.source.train_batches(seed=config.seed, epoch=number, steps=steps,
                                           per_rank_batch_size=batching.per_rank_batch_size,
                                           first_step=epoch.first_step)
        epoch_start = time.perf_counter()
        try:
            train_loss = loop.train(batches, epoch, control)
        except preemption.Stopped:
            hooks.close()
            raise
        record, stop = loop.end_epoch(
            number, train_loss, train_seconds=time.perf_counter() - epoch_start,
            images_trained=(steps - epoch.first_step + 1) * batching.global_batch_size)
        history.append(record)
        if stop:
            break

    summary = records.summarize(job, history, first_epoch=start.first_epoch,
                                wall_seconds=time.perf_counter() - wall_start,
                                clock=hooks.clock, steps_done_before=start.steps_done,
                                mode="custom",
                                train_step_traces=loop.train_step.experimental_get_tracing_count())
    hooks.close()
    job_lib.finish(summary, model, optimizer, model_dir=config.model_dir,
                   export=config.export)
    return summary
