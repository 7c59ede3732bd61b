"""What every training path does before its first step and after its last.

The custom loop (train.py) and the Keras fit baseline (keras_fit.py) both
start here, so they run on the same devices, thread pools, batches and data,
and leave the same files behind.
"""

import dataclasses
import json
import os
import socket
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_mnist import (config as config_lib, export, inputs, model as model_lib, outputs, runtime,
                       timing)
from hvd_mnist.errors import UserFacingError


@dataclasses.dataclass(frozen=True)
class Job:
    topology: runtime.Topology
    batching: config_lib.Batching
    source: "inputs.MemoryInput | inputs.RecordInput"  # where batches come from
    steps_per_epoch: int
    dtype: tf.DType  # of the model, its inputs and its optimizer (float64 only in tests)
    threads_per_rank: int = 0


def start(config: config_lib.TrainConfig) -> Job:
    """Horovod, devices and threads, then everything that can be validated before training.

    Every check here runs on every rank and a failure on any rank stops them all
    (`runtime.on_every_rank`, `runtime.on_chief`), so a bad input is reported by
    every rank, not just one.
    """
    topology, threads = start_horovod(config)
    job = runtime.on_every_rank(lambda: open_job(config, topology, threads))
    runtime.on_chief(lambda: make_model_dir(config.model_dir))
    return job


def start_process(config: config_lib.TrainConfig) -> Job:
    """`start` without any collective operation, so a worker joining an elastic job,
    whose peers are waiting in their state's sync, can run it alone."""
    return open_job(config, *start_horovod(config))


def start_horovod(config: config_lib.TrainConfig) -> tuple[runtime.Topology, int]:
    """Horovod, this process's GPU and its thread pools; returns where it runs and its
    number of threads."""
    runtime.configure_determinism(config.deterministic)
    topology = runtime.init_horovod()
    runtime.configure_gpus(topology.local_rank)
    threads = runtime.threads_per_rank(config.threads_per_rank, topology.local_size,
                                       runtime.available_cpus())
    runtime.configure_threads(threads)
    return topology, threads


def open_job(config: config_lib.TrainConfig, topology: runtime.Topology, threads: int) -> Job:
    """Batching, the input and the steps per epoch, for one rank (may raise UserFacingError)."""
    batching = config_lib.resolve_batching(config, topology.size)
    dtype = tf.float64 if config.float64 else tf.float32
    source = inputs.open_input(config.input, config.data_dir,
                               inputs.Shard(topology.rank, topology.size),
                               config.shuffle_buffer, dtype)
    steps = config_lib.steps_per_epoch(
        source.usable_train_examples(), batching.global_batch_size,
        config.steps_per_epoch, config.backward_passes_per_step)
    return Job(topology, batching, source, steps, dtype, threads)


def learning_rate(config: config_lib.TrainConfig, job: Job):
    """The run's (scaled) learning rate: a number, or a schedule over the whole run.

    The schedule reads the optimizer's step counter, which checkpoints keep, so
    a resumed run continues the schedule where it stopped.
    """
    rate = job.batching.learning_rate
    if config.lr_schedule == "warmup_linear":
        rate = model_lib.WarmupLinearDecay(
            rate, warmup_steps=round(config.warmup_epochs * job.steps_per_epoch),
            total_steps=config.epochs * job.steps_per_epoch)
    return rate


def scheduled_optimizer(config: config_lib.TrainConfig, job: Job):
    """The custom loop's optimizer, with the run's learning rate."""
    return model_lib.make_optimizer(config.optimizer, learning_rate(config, job))


def epoch_record(epoch: int, train_loss: float, test_metrics: dict, *, train_seconds: float,
                 images_trained: int) -> dict:
    """One epoch's results as summary.json's history lists them, for both paths.

    `test_metrics` are already reduced across ranks (test_loss, test_accuracy,
    test_examples).
    """
    return {"epoch": epoch, "train_loss": train_loss, **test_metrics,
            "train_seconds": train_seconds,
            "images_per_second": images_trained / train_seconds}


def end_epoch(config: config_lib.TrainConfig, record: dict, epochs: int) -> bool:
    """Prints the epoch's line; True when --target_accuracy is reached and training stops.

    Every rank gets the same answer: the accuracy in `record` is already reduced.
    """
    runtime.log(format_epoch(record, epochs))
    if config.target_accuracy and record["test_accuracy"] >= config.target_accuracy:
        runtime.log(f"reached --target_accuracy={config.target_accuracy:g} after epoch "
                    f"{record['epoch']}")
        return True
    return False


def make_model_dir(model_dir: str) -> None:
    """Creates model_dir (rank 0 only), before anything else is done."""
    try:
        os.makedirs(model_dir, exist_ok=True)
    except OSError as e:
        raise UserFacingError(f"--model_dir={model_dir} is not writable ({e.strerror})") from None


def record_start(config: config_lib.TrainConfig, num_workers: int,
                 resumed_after_epoch: int | None) -> None:
    """Appends this start's resolved config to model_dir/config.json (rank 0 only).

    Called once the run is known to go ahead (a refused --resume writes
    nothing), so config.json lists every start that trained in this
    model_dir, fresh or resumed, oldest first.
    """
    path = os.path.join(config.model_dir, "config.json")
    starts = []
    if os.path.exists(path):
        try:
            with open(path) as f:
                starts = json.load(f)["starts"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserFacingError(f"{path} is not a config history written by hvd_mnist "
                                  f"({e}); move it away or use another --model_dir") from None
    starts.append({"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "resumed_after_epoch": resumed_after_epoch, "num_workers": num_workers,
                   "config": config.to_dict()})
    outputs.write_json(path, {"starts": starts})


def export_weights(directory: str, model, rank: int) -> None:
    """Every rank writes its own weights, so tests can compare ranks and runs."""
    os.makedirs(directory, exist_ok=True)
    np.savez(os.path.join(directory, f"weights_rank{rank}.npz"),
             *[v.numpy() for v in model.weights])


def summarize(job: Job, history: list, first_epoch: int, wall_seconds: float,
              clock: timing.StepClock, **extra) -> dict:
    """The run's summary from its per-epoch records (see format_epoch); every rank calls it."""
    # One collective for each rank's memory and where it ran: on several hosts the
    # latter shows that local_rank/local_size (and so the thread count) were per host.
    gathered = hvd.allgather_object(
        ({**dataclasses.asdict(job.topology), "host": socket.gethostname(),
          "threads_per_rank": job.threads_per_rank}, timing.peak_rss_mib()), name="ranks")
    ranks = [rank for rank, _ in gathered]
    peak_rss_mib_per_rank = [peak_rss_mib for _, peak_rss_mib in gathered]
    train_seconds = sum(r["train_seconds"] for r in history)
    steps = len(history) * job.steps_per_epoch
    final = ({k: history[-1][k] for k in ("test_loss", "test_accuracy", "test_examples")}
             if history else {})
    return {
        "num_workers": job.topology.size,
        "epochs_run": len(history),
        "first_epoch": first_epoch,
        "steps": steps,
        "global_batch_size": job.batching.global_batch_size,
        "wall_seconds": wall_seconds,
        "train_seconds": train_seconds,
        "images_per_second": (steps * job.batching.global_batch_size / train_seconds
                              if train_seconds else 0.0),
        "peak_rss_mib_per_rank": peak_rss_mib_per_rank,
        "ranks": ranks,
        "timing": {**clock.to_dict(), "summary_unix_time": time.time()},
        **extra,
        **final,
        "history": history,
    }


def format_epoch(record: dict, epochs: int) -> str:
    return (f"epoch {record['epoch']}/{epochs}: train loss {record['train_loss']:.4f}, "
            f"test loss {record['test_loss']:.4f}, test accuracy "
            f"{100 * record['test_accuracy']:.2f}% of {record['test_examples']} images, "
            f"{record['train_seconds']:.1f} s, {record['images_per_second']:.0f} images/s")


def finish(config: config_lib.TrainConfig, summary: dict, model) -> None:
    """Rank 0 writes summary.json and (with --export) the exported model, and prints the
    summary; every rank calls it."""
    runtime.on_chief(lambda: outputs.write_json(os.path.join(config.model_dir, "summary.json"),
                                                summary))
    runtime.log(format_summary(summary))
    if config.export:
        directory = export.export_on_chief(config.model_dir, model, summary)
        runtime.log(f"exported the model to {directory}: python -m hvd_mnist.predict "
                    f"--model={directory} FILE...")


def format_summary(summary: dict) -> str:
    lines = [f"done: {summary['epochs_run']} epoch(s), {summary['steps']} steps on "
             f"{summary['num_workers']} worker(s), wall {summary['wall_seconds']:.1f} s, "
             f"training {summary['train_seconds']:.1f} s, "
             f"{summary['images_per_second']:.0f} images/s"]
    if "test_accuracy" in summary:
        lines.append(f"final test loss {summary['test_loss']:.4f}, test accuracy "
                     f"{100 * summary['test_accuracy']:.2f}% of {summary['test_examples']} images")
    return "\n".join(lines)
