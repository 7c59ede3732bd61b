"""The step time of N data-parallel workers, term by term: make scaling's model of two hosts
(reports/scaling.md), carried past one machine on paper.

A step is the compute plus what of the gradients' allreduce the compute does not hide. The
allreduce is Horovod's ring: each worker sends and receives 2(N-1)/N x the bytes over its own
link, through a stack with a cost of its own per byte (copies, the reduction, TCP), and each
collective call waits 2(N-1) hops of latency. Before each group of gradients goes out,
Horovod's background thread waits for its next cycle (half a cycle on average) and the ranks
agree on what is ready (a small allreduce of the response cache's bits: a tree, 2 log2(N)
hops). Tensor fusion sends each group as one buffer; without it, one call per tensor. With
overlap, a group leaves as soon as backward has produced it, so the big Dense layer's gradient
travels while the second convolution's backward pass still computes.

At N = 2, one fused buffer and no overlap, this is make scaling's fit (`two_host_step`); the
stack's cost per byte and fp16's casts are calibrated there, from the probe of the unlimited
link.

Its tables in docs/performance.md: `python -m tools.bench.scaling_tables`.
"""

import dataclasses
import json
import math
import os

import numpy as np

from tools.bench import flops, launch

REPORT = os.path.join(launch.REPO_ROOT, "reports", "scaling.json")
# make scaling's target for the fit's worst error over the two-host rows.
TWO_HOST_TARGET = 0.25
# Horovod v0.28.1's default HOROVOD_CYCLE_TIME (horovod/common/operations.cc: SetCycleTimeMs(1)).
# Its fusion buffer (128 MiB there) holds all of this model's 4.8 MB at once.
CYCLE_SECONDS = 0.001


@dataclasses.dataclass(frozen=True)
class Gradient:
    """One trainable tensor's gradient: its layer, float32 bytes, and the fraction of a
    step's compute done when backward has produced it."""
    layer: str
    nbytes: int
    ready: float


@dataclasses.dataclass(frozen=True)
class Stack:
    """What carries the allreduce. hop_seconds: one ring step's latency; seconds_per_byte:
    the stack's own cost per byte of ring traffic; cast_seconds: fp16 compression's casts of
    all the gradients, there and back, per step; overlap: whether the allreduce runs while
    backward computes."""
    name: str
    hop_seconds: float
    seconds_per_byte: float
    overlap: bool
    cast_seconds: float = 0.0
    cycle_seconds: float = CYCLE_SECONDS


# ---------------------------------------------------------------- the gradients

def model_gradients(model) -> list:
    """Every trainable tensor of `model` in the order backward produces them (last layer
    first), its readiness counted in training FLOPs (tools/bench/flops.py): the forward pass,
    then per layer its weights' gradient and (but for the first) its input's gradient."""
    costs = [(layer, flops.layer_forward_flops(layer)) for layer in model.layers]
    first = next(layer for layer, forward in costs if forward)
    total = sum(flops.layer_training_flops(layer, layer is first) for layer, f in costs if f)
    done, gradients = sum(forward for _, forward in costs), []
    for layer, forward in reversed(costs):
        done += forward  # the weights' gradient
        gradients += [Gradient(flops.describe(layer),
                               math.prod(w.shape) * np.dtype(w.dtype).itemsize, done / total)
                      for w in layer.trainable_weights]
        if layer is not first:
            done += forward  # the input's gradient, for the layer below
    return gradients


# ---------------------------------------------------------------- the terms

def ring_factor(workers: int) -> float:
    """The share of the buffer each worker sends (and receives) in a ring allreduce."""
    return 2 * (workers - 1) / workers


def wire_seconds(nbytes: float, workers: int, bits_per_second) -> float:
    """The ring's bytes over one worker's link; None: the link is not the limit."""
    if bits_per_second is None:
        return 0.0
    return ring_factor(workers) * nbytes * 8 / bits_per_second


def stack_seconds(nbytes: float, workers: int, seconds_per_byte: float) -> float:
    """The stack's own work on the ring's bytes: copies, the reduction, the TCP stack."""
    return ring_factor(workers) * nbytes * seconds_per_byte


def ring_latency_seconds(workers: int, hop_seconds: float) -> float:
    """One collective call: 2(N-1) steps around the ring, each waiting one hop."""
    return 2 * (workers - 1) * hop_seconds


def negotiation_seconds(workers: int, hop_seconds: float, cycle_seconds: float) -> float:
    """Per group of gradients: half a cycle's wait on average, then the ranks' agreement on
    what is ready (a tree up and down)."""
    return cycle_seconds / 2 + 2 * math.ceil(math.log2(workers)) * hop_seconds


def call_seconds(nbytes, workers, bits_per_second, stack) -> float:
    """One allreduce call of `nbytes` (as sent) once the ranks have agreed on it."""
    return (wire_seconds(nbytes, workers, bits_per_second)
            + stack_seconds(nbytes, workers, stack.seconds_per_byte)
            + ring_latency_seconds(workers, stack.hop_seconds))


def groups(gradients, compute_seconds, stack) -> list:
    """[(ready seconds, [bytes of each tensor])]: without overlap everything is ready when
    the compute ends; with it, tensors ready within one cycle of a group's first go with it."""
    if not stack.overlap:
        return [(compute_seconds, [g.nbytes for g in gradients])]
    result = []
    for g in sorted(gradients, key=lambda g: g.ready):
        ready = g.ready * compute_seconds
        if result and ready - result[-1][2] <= stack.cycle_seconds:
            result[-1][0], result[-1][1] = ready, result[-1][1] + [g.nbytes]
        else:
            result.append([ready, [g.nbytes], ready])
    return [(ready, sizes) for ready, sizes, _ in result]


def step_seconds(compute_seconds, gradients, workers, bits_per_second, stack,
                 precision="fp32", fused=True, passes=1) -> float:
    """One batch's step: compute, then whatever the allreduce adds after it, shared by the
    `passes` batches accumulated per allreduce. fp16 sends half the bytes, after casts that
    take each group's share of the stack's cast_seconds."""
    if workers == 1:
        return compute_seconds
    fp16 = precision == "fp16"
    total_bytes = sum(g.nbytes for g in gradients)
    link_free = finish = 0.0
    for ready, sizes in groups(gradients, compute_seconds, stack):
        calls = [sum(sizes)] if fused else sizes
        casts = stack.cast_seconds * sum(sizes) / total_bytes if fp16 else 0.0
        start = max(ready + casts
                    + negotiation_seconds(workers, stack.hop_seconds, stack.cycle_seconds),
                    link_free)
        link_free = start + sum(call_seconds(nbytes / (2 if fp16 else 1), workers,
                                             bits_per_second, stack) for nbytes in calls)
        finish = max(finish, link_free)
    return compute_seconds + max(0.0, finish - compute_seconds) / passes


def efficiency(compute_seconds, *args, **kwargs) -> float:
    """Images/s of N workers over N x one worker's, as reports/scaling.md counts it."""
    return compute_seconds / step_seconds(compute_seconds, *args, **kwargs)


# ---------------------------------------------------------------- make scaling's fit

def two_host_step(compute_seconds, fixed_seconds, gradient_bytes, bits_per_second,
                  passes) -> float:
    """make scaling's model: compute + (the ring's bytes over the link + the allreduce's
    fixed cost on an unlimited link) / K, at N = 2."""
    return compute_seconds + (wire_seconds(gradient_bytes, 2, bits_per_second)
                              + fixed_seconds) / passes


def calibrated_stack(report, name, hop_seconds, gradient_bytes, overlap=False) -> Stack:
    """The stack of make scaling's probe: its cost per byte is what the float32 allreduce
    on the unlimited link took beyond the latency terms at N = 2; its casts, what the
    float16 one took beyond those and its half of the bytes."""
    probe = report["probes"]["unlimited"]
    latency = (negotiation_seconds(2, hop_seconds, CYCLE_SECONDS)
               + ring_latency_seconds(2, hop_seconds))
    ring_bytes = ring_factor(2) * gradient_bytes
    per_byte = max(0.0, probe["allreduce_fp32_seconds"] - latency) / ring_bytes
    casts = max(0.0, probe["allreduce_fp16_seconds"] - latency - per_byte * ring_bytes / 2)
    return Stack(name, hop_seconds, per_byte, overlap, cast_seconds=casts)


def load_report(path: str = REPORT) -> dict:
    with open(path) as f:
        return json.load(f)
