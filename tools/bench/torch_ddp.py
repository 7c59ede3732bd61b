"""hvd_mnist's benchmark job written in PyTorch DistributedDataParallel: what make bench sets
hvd_mnist beside (versus.py), as a PyTorch user would write it.

    torchrun --standalone --nproc_per_node=2 -m tools.bench.torch_ddp --data_dir=data/tfds \\
        --out_dir=runs/torch [--steps=160] [--precision=mixed_bfloat16]

The same job as `horovodrun -np N python -m hvd_mnist.main --optimizer=adam --epochs=1
--max_steps_per_epoch=160 --noexport`: the same Conv32-Conv64-MaxPool-Dropout(0.25)-
Dense128-Dropout(0.5)-Dense10 (1,199,882 weights, Keras's initialisation: glorot_uniform
weights, zero biases), Adam(0.001 x workers, Keras's epsilon 1e-7), 128 images per worker
per step, the decoded copy make data writes in the order hvd_mnist gives each rank
(mnist_numpy.py,
hvd_mnist/data/order.py), as many threads per process as hvd_mnist's default (cores / local
workers), gradients averaged by DDP over Gloo, then each rank evaluates its share of the
10,000 test images, the sums meet on every rank, and rank 0 saves a checkpoint.

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

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hvd_mnist.data import order
from hvd_mnist.outputs.timing import StepClock
from tools.bench import mnist_numpy, steady_state

RESULT_PREFIX = "torch_ddp result: "
PRECISIONS = ("float32", "mixed_bfloat16")


def parse_flags(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default="data/tfds", help="The prepared mnist (make data).")
    parser.add_argument("--out_dir", required=True, help="Where rank 0 writes the checkpoint "
                        "and summary.json.")
    parser.add_argument("--steps", type=int, default=160, help="Steps per worker (one epoch).")
    parser.add_argument("--batch_size", type=int, default=128, help="Images per worker per step.")
    parser.add_argument("--learning_rate", type=float, default=0.001, help="Per worker; "
                        "Adam's rate is this x workers.")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="mixed_bfloat16: forward and loss under torch.autocast(bfloat16).")
    parser.add_argument("--threads_per_rank", type=int, default=0,
                        help="0: cores / local workers, at least 1 (hvd_mnist's default).")
    parser.add_argument("--launch_unix_time", type=float, default=0.0, help="When the "
                        "launcher started (the bench's clock); 0: torchrun's start, from /proc.")
    parser.add_argument("--timeout_seconds", type=float, default=300,
                        help="A collective waiting longer fails the job instead of hanging.")
    return parser.parse_args(argv)


class MnistCnn(nn.Module):
    """hvd_mnist's model (training/model.py) on channels-first images; the softmax is in the
    loss (cross_entropy of the logits)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.dense1 = nn.Linear(64 * 12 * 12, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.dense2 = nn.Linear(128, 10)
        for layer in (self.conv1, self.conv2, self.dense1, self.dense2):
            nn.init.xavier_uniform_(layer.weight)  # Keras's glorot_uniform: the same fans
            nn.init.zeros_(layer.bias)

    def forward(self, images):
        x = F.relu(self.conv1(images))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.dense1(torch.flatten(x, 1))))
        return self.dense2(x)


def threads_per_rank(requested: int, local_size: int) -> int:
    """hvd_mnist's rule (worker/runtime.py): the cores shared by the host's ranks."""
    return requested or max(1, len(os.sched_getaffinity(0)) // local_size)


def launcher_start_unix_time() -> float:
    """When the parent process (torchrun) started, from /proc (clock ticks since boot)."""
    with open(f"/proc/{os.getppid()}/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")


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
    launch_unix = args.launch_unix_time or launcher_start_unix_time()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_seconds))
    rank, size = dist.get_rank(), dist.get_world_size()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    threads = threads_per_rank(args.threads_per_rank, local_size)
    torch.set_num_threads(threads)

    train_images, train_labels = mnist_numpy.load_split(args.data_dir, "train")
    test_images, test_labels = mnist_numpy.load_split(args.data_dir, "test")
    steps_indices = order.rank_batch_indices(
        order.epoch_permutation(args.seed, 1, len(train_labels)), args.steps, args.batch_size,
        rank, size)

    torch.manual_seed(args.seed)  # the same weights everywhere; DDP broadcasts rank 0's too
    model = DistributedDataParallel(MnistCnn())  # DDP: averages gradients over Gloo
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate * size, eps=1e-7)
    torch.manual_seed(args.seed + 1 + rank)  # each rank its own dropout masks

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
            "launch_to_first_step_seconds": timing["first_step_unix_time"] - launch_unix,
            "peak_rss_mib_per_rank": peak_rss, "host": socket.gethostname(), "timing": timing}
        with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(RESULT_PREFIX + json.dumps(summary), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_flags())
