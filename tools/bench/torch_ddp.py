"""hvd_mnist's benchmark job in PyTorch DistributedDataParallel, as a PyTorch user writes it.

make bench sets it beside hvd_mnist (versus.py, whose DIFFERENCES says what is the same in
both jobs and what differs).

    torchrun --standalone --nproc_per_node=2 -m tools.bench.torch_ddp \\
        --arrays_dir=runs/bench/mnist_arrays --out_dir=runs/torch \\
        --launch_unix_time=$(date +%s.%N) [--precision=mixed_bfloat16]

Rank 0 writes out_dir/summary.json with the keys the bench reads of hvd_mnist's (timing,
peak_rss_mib_per_rank, test_accuracy, ...) and prints it as one line, `RESULT_PREFIX{json}`.
Flags are argparse's, not absl's: this venv holds only PyTorch and numpy.
"""

import argparse
import datetime
import json
import math
import os
import resource
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hvd_mnist.data import order
from hvd_mnist.outputs.timing import StepClock
from tools.bench import steady_state

RESULT_PREFIX = "torch_ddp result: "
PRECISIONS = ("float32", "mixed_bfloat16")
SEED = 42  # hvd_mnist's default --seed
LEARNING_RATE = 0.001  # per worker: Adam's rate is this x workers


def parse_flags(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays_dir", required=True, help="make data's decoded copy as .npy "
                        "files (versus.write_arrays).")
    parser.add_argument("--out_dir", required=True, help="Where rank 0 writes the checkpoint "
                        "and summary.json.")
    parser.add_argument("--launch_unix_time", type=float, required=True,
                        help="When the launcher started, on the bench's clock.")
    parser.add_argument("--steps", type=int, default=160, help="Steps per worker (one epoch).")
    parser.add_argument("--batch_size", type=int, default=128, help="Images per worker per step.")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="mixed_bfloat16: forward and loss under torch.autocast(bfloat16).")
    parser.add_argument("--timeout_seconds", type=float, default=300,
                        help="A collective waiting longer fails the job instead of hanging.")
    return parser.parse_args(argv)


def mnist_cnn() -> nn.Sequential:
    """hvd_mnist's model (training/model.py) on channels-first images, a module per Keras
    layer (a convolution's or dense layer's ReLU with it); the softmax is in the loss
    (cross_entropy of the logits)."""
    model = nn.Sequential(nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU()),
                          nn.Sequential(nn.Conv2d(32, 64, 3), nn.ReLU()),
                          nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
                          nn.Sequential(nn.Linear(64 * 12 * 12, 128), nn.ReLU()),
                          nn.Dropout(0.5), nn.Linear(128, 10))
    for layer in model.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(layer.weight)  # Keras's glorot_uniform: the same fans
            nn.init.zeros_(layer.bias)
    return model


def load_split(arrays_dir: str, split: str):
    """(uint8 images (n, 28, 28, 1), int64 labels (n,)) that versus.write_arrays wrote."""
    return tuple(np.load(os.path.join(arrays_dir, f"{split}-{what}.npy"), allow_pickle=False)
                 for what in ("images", "labels"))


def batch(images, labels, indices):
    """uint8 (n, 28, 28, 1) -> float32 [0, 1] (n, 1, 28, 28), as splits.normalize does."""
    x = torch.from_numpy(images[indices]).permute(0, 3, 1, 2).float().div_(255.0)
    return x, torch.from_numpy(labels[indices])


def autocast(precision: str):
    return torch.autocast(device_type="cpu", dtype=torch.bfloat16,
                          enabled=precision == "mixed_bfloat16")


def evaluate(model, images, labels, indices, batch_size: int, precision: str) -> dict:
    """Loss and accuracy over every rank's share of the test split (step.evaluate)."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad(), autocast(precision):
        for start in range(0, len(indices), batch_size):
            x, y = batch(images, labels, indices[start:start + batch_size])
            logits = model(x).float()
            sums += torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                                  (logits.argmax(1) == y).sum().item(), len(y)],
                                 dtype=torch.float64)
    dist.all_reduce(sums)  # sums of loss, correct, examples over the ranks
    model.train()
    loss, correct, examples = sums.tolist()
    return {"test_loss": loss / examples, "test_accuracy": correct / examples,
            "test_examples": int(examples)}


def main(args) -> None:
    wall_start = time.perf_counter()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_seconds))
    rank, size = dist.get_rank(), dist.get_world_size()
    # hvd_mnist's default (worker/runtime.py): the cores shared by the host's ranks.
    threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ["LOCAL_WORLD_SIZE"]))
    torch.set_num_threads(threads)

    train_images, train_labels = load_split(args.arrays_dir, "train")
    test_images, test_labels = load_split(args.arrays_dir, "test")
    steps_indices = order.rank_batch_indices(
        order.epoch_permutation(SEED, 1, len(train_labels)), args.steps, args.batch_size,
        rank, size)

    torch.manual_seed(SEED)  # the same weights everywhere; DDP broadcasts rank 0's too
    model = DistributedDataParallel(mnist_cnn())  # DDP: averages gradients over Gloo
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE * size, eps=1e-7)
    torch.manual_seed(SEED + 1 + rank)  # each rank its own dropout masks

    clock = StepClock(args.batch_size * size)
    clock.epoch_started()
    train_start, loss_sum = time.perf_counter(), 0.0
    for step, indices in enumerate(steps_indices, start=1):
        images, labels = batch(train_images, train_labels, indices)
        with autocast(args.precision):
            loss = F.cross_entropy(model(images).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        clock.step_done()
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            raise SystemExit(f"torch_ddp: loss {loss_value} at step {step}")
        loss_sum += loss_value
    train_seconds = time.perf_counter() - train_start

    metrics = evaluate(model, test_images, test_labels,
                       order.eval_indices(len(test_labels), rank, size),
                       args.batch_size, args.precision)
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": 1}, os.path.join(args.out_dir, "checkpoint.pt"))
    peak_rss = [None] * size
    dist.all_gather_object(peak_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if rank == 0:
        timing = clock.to_dict()
        summary = {
            "framework": f"PyTorch {torch.__version__}", "num_workers": size,
            "threads_per_rank": threads, "precision": args.precision, "steps": args.steps,
            "global_batch_size": args.batch_size * size, "train_loss": loss_sum / args.steps,
            **metrics, "wall_seconds": time.perf_counter() - wall_start,
            "train_seconds": train_seconds,
            "images_per_second": steady_state.images_per_second(
                timing["window_images_per_second"]),
            "launch_to_first_step_seconds": (timing["first_step_unix_time"]
                                             - args.launch_unix_time),
            "peak_rss_mib_per_rank": peak_rss, "host": socket.gethostname(), "timing": timing}
        with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(RESULT_PREFIX + json.dumps(summary), flush=True)
    # Every rank tears Gloo down together: a rank that destroyed its group while rank 0 was
    # still writing aborted once at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_flags())
