"""The run's records: each epoch's results, the history of starts in config.json, and
the summary, as the trainers print them and summary.json keeps them.

Every trainer makes its records here, so their files and lines are the same; when to
stop and when to save are training/'s decisions.
"""

import dataclasses
import json
import os
import socket
import time

import horovod.tensorflow as hvd

from hvd_mnist import config as config_lib
from hvd_mnist.errors import UserFacingError
from hvd_mnist.outputs import files, timing


def epoch_record(epoch: int, train_loss: float, test_metrics: dict, *, train_seconds: float,
                 images_trained: int) -> dict:
    """One epoch's results as summary.json's history lists them, for both paths.

    `test_metrics` are already reduced across ranks (test_loss, test_accuracy,
    test_examples).
    """
    return {"epoch": epoch, "train_loss": train_loss, **test_metrics,
            "train_seconds": train_seconds,
            "images_per_second": timing.images_per_second(images_trained, train_seconds)}


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
    files.write_json(path, {"starts": starts})


def summarize(job, history: list, first_epoch: int, wall_seconds: float,
              clock: timing.StepClock, steps_done_before: int = 0,
              trained: tuple[int, int] | None = None, **extra) -> dict:
    """The run's summary from its per-epoch records (see format_epoch); every rank calls it.
    `steps_done_before`: steps of the first epoch done before a mid-epoch resume.
    `trained`: (steps, images) where a trainer counts them itself (an elastic run's epochs
    may have run at several sizes); by default the epochs' steps and steps x global batch."""
    # One collective for each rank's memory and where it ran: on several hosts the
    # latter shows that local_rank/local_size (and so the thread count) were per host.
    gathered = hvd.allgather_object(
        ({**dataclasses.asdict(job.topology), "host": socket.gethostname(),
          "threads_per_rank": job.threads_per_rank}, timing.peak_rss_mib()), name="ranks")
    ranks = [rank for rank, _ in gathered]
    peak_rss_mib_per_rank = [peak_rss_mib for _, peak_rss_mib in gathered]
    train_seconds = sum(r["train_seconds"] for r in history)
    if trained is None:
        steps = len(history) * job.steps_per_epoch - steps_done_before
        trained = (steps, steps * job.batching.global_batch_size)
    steps, images = trained
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
        "images_per_second": timing.images_per_second(images, train_seconds),
        "peak_rss_mib_per_rank": peak_rss_mib_per_rank,
        "ranks": ranks,
        "timing": clock.to_dict(),
        **extra,
        **final,
        "history": history,
    }


def format_epoch(record: dict, epochs: int) -> str:
    return (f"epoch {record['epoch']}/{epochs}: train loss {record['train_loss']:.4f}, "
            f"test loss {record['test_loss']:.4f}, test accuracy "
            f"{100 * record['test_accuracy']:.2f}% of {record['test_examples']} images, "
            f"{record['train_seconds']:.1f} s, {record['images_per_second']:.0f} images/s")


def format_summary(summary: dict) -> str:
    lines = [f"done: {summary['epochs_run']} epoch(s), {summary['steps']} steps on "
             f"{summary['num_workers']} worker(s), wall {summary['wall_seconds']:.1f} s, "
             f"training {summary['train_seconds']:.1f} s, "
             f"{summary['images_per_second']:.0f} images/s"]
    if "test_accuracy" in summary:
        lines.append(f"final test loss {summary['test_loss']:.4f}, test accuracy "
                     f"{100 * summary['test_accuracy']:.2f}% of {summary['test_examples']} images")
    return "\n".join(lines)
