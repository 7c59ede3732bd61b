"""The PyTorch job's training step (torch_ddp.py) taken apart, one process, one thread, synthetic
batches, and its gradients' allreduce over Gloo: the PyTorch half of step_profile.py.

    python -m tools.bench.step_profile_torch [--min_seconds=1]        (one JSON line)
    torchrun --standalone --nproc_per_node=2 -m tools.bench.step_profile_torch --allreduce

Timed as step_profile.py times TensorFlow's: every layer's forward (training mode, so
dropout draws its mask), its forward and backward together (backward: their difference; the
gradients of its weights and, but for the first layer, of its input, driven by a fixed
upstream gradient), the Adam update of fixed gradients, the whole step; each piece called
for at least min_seconds after two warm-up calls. Then torch.profiler over PROFILED_STEPS
whole steps: each op's own CPU time. --allreduce: the model's gradients averaged over the
ranks with torch.distributed.all_reduce, as one flat buffer (DDP's one 25 MB bucket holds
them all) and tensor by tensor, each after a barrier so no rank's wait is counted; medians
of REPEATS after WARMUP, as allreduce_probe.py times Horovod's.
"""

import argparse
import collections
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tools.bench.torch_ddp import MnistCnn

BATCH = 128
PROFILED_STEPS = 10
WARMUP, REPEATS = 3, 15


def seconds_per_call(function, min_seconds: float, min_calls: int = 3) -> float:
    """Wall seconds of one call, after two warm-up calls (PyTorch on the CPU returns once
    the work is done)."""
    for _ in range(2):
        function()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        function()
        calls += 1
    return (time.perf_counter() - start) / calls


def pieces_of(model):
    """(name, function) of each piece of the forward pass, as Keras's layers split it (a
    convolution's or dense layer's ReLU belongs to it)."""
    return [("Conv2D(32)", lambda x: F.relu(model.conv1(x))),
            ("Conv2D(64)", lambda x: F.relu(model.conv2(x))),
            ("MaxPooling2D", lambda x: F.max_pool2d(x, 2)),
            ("Dropout(0.25)", model.dropout1),
            ("Flatten", lambda x: torch.flatten(x, 1)),
            ("Dense(128)", lambda x: F.relu(model.dense1(x))),
            ("Dropout(0.5)", model.dropout2),
            ("Dense(10) and the loss", model.dense2)]


def measure(min_seconds: float) -> dict:
    torch.manual_seed(0)
    model = MnistCnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001, eps=1e-7)
    images = torch.rand(BATCH, 1, 28, 28)
    labels = torch.randint(0, 10, (BATCH,))

    def step():
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    pieces, layer_input = [], images
    named = pieces_of(model)
    for index, (name, piece) in enumerate(named):
        output = piece(layer_input).detach()
        is_last = index == len(named) - 1
        upstream = torch.randn_like(output)
        x = layer_input.detach().requires_grad_(index > 0)

        def both(piece=piece, x=x, upstream=upstream, is_last=is_last):
            model.zero_grad(set_to_none=True)  # new gradients each call, as TF's tape gives
            x.grad = None
            result = piece(x)
            if is_last:
                F.cross_entropy(result, labels).backward()
            elif result.requires_grad:
                result.backward(upstream)

        forward_seconds = seconds_per_call(lambda piece=piece, x=x: piece(x), min_seconds)
        pieces.append({"name": name, "forward_ms": 1e3 * forward_seconds,
                       "backward_ms": 1e3 * (seconds_per_call(both, min_seconds)
                                             - forward_seconds)})
        layer_input = output
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter) * 1e-3
    return {"framework": f"PyTorch {torch.__version__}", "threads": torch.get_num_threads(),
            "batch": BATCH, "pieces": pieces,
            "optimizer_ms": 1e3 * seconds_per_call(optimizer.step, min_seconds),
            "step_ms": 1e3 * seconds_per_call(step, min_seconds),
            "profiled_steps": PROFILED_STEPS, "ops": op_profile(step, PROFILED_STEPS)}


def op_profile(step, steps: int) -> list:
    """[{op, ms_per_step}]: each op's own CPU time over `steps` steps, from torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            step()
    totals = collections.Counter({event.key: event.self_cpu_time_total / 1e3 / steps
                                  for event in profiler.key_averages()})
    return [{"op": op, "ms_per_step": ms} for op, ms in totals.most_common() if ms > 0]


def allreduce() -> dict:
    """Median seconds of averaging the model's gradients over the ranks (rank 0's figures)."""
    dist.init_process_group("gloo")
    size = dist.get_world_size()
    gradients = [torch.randn_like(p) for p in MnistCnn().parameters()]
    flat = torch.cat([g.reshape(-1) for g in gradients])

    def median_seconds(function) -> float:
        seconds = []
        for repeat in range(WARMUP + REPEATS):
            dist.barrier()
            start = time.perf_counter()
            function()
            if repeat >= WARMUP:
                seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)

    def per_tensor():
        for gradient in gradients:
            dist.all_reduce(gradient)
            gradient.div_(size)

    result = {"ranks": size, "gradient_bytes": flat.numel() * flat.element_size(),
              "allreduce_flat_seconds": median_seconds(
                  lambda: dist.all_reduce(flat) or flat.div_(size)),
              "allreduce_per_tensor_seconds": median_seconds(per_tensor)}
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min_seconds", type=float, default=1.0)
    parser.add_argument("--allreduce", action="store_true",
                        help="Under torchrun: time the gradients' allreduce instead.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.allreduce:
        probe = allreduce()
        if int(os.environ.get("RANK", "0")) == 0:
            print("PROBE " + json.dumps(probe), flush=True)
    else:
        started = time.perf_counter()
        result = measure(args.min_seconds)
        result["seconds"] = time.perf_counter() - started
        print("PROFILE " + json.dumps(result), flush=True)
