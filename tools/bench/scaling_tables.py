"""docs/performance.md's "Past one machine, on paper": tools/bench/scaling_model.py's
efficiency for 8-512 workers at 10-400 Gbit/s, for the CPU step reports/scaling.json measured
and two GPU steps, with each lever, and Horovod's published ResNet-101 case beside it.

    python -m tools.bench.scaling_tables

Each assumption is a constant here, with where it comes from.
"""

import dataclasses
import math
import subprocess
import sys

from tools.bench import flops, launch, scaling, scaling_model as sm

MOST_WORKERS, TABLE_WORKERS = 512, (8, 32, 128, 512)
LINKS_GBIT = (10, 25, 100, 400)
BATCH = 128
# keras-team/keras examples/mnist_cnn.py, this very model at batch 128 with Adadelta:
# "16 seconds per epoch on a GRID K520 GPU" (the epoch's 10,000-image validation included).
K520_EPOCH_SECONDS, MNIST_TRAIN_IMAGES = 16.0, 60_000
# float32 peaks: one GK104 of a GRID K520, 1536 cores x 2 FLOP x 0.8 GHz (spec pages give
# 745-800 MHz for the GRID GK104s: 2.3-2.5 TFLOP/s); a V100 (SXM2), 5120 cores x 2 FLOP x
# 1.53 GHz.
K520_PEAK_FLOPS, V100_PEAK_FLOPS = 1536 * 2 * 0.8e9, 15.7e12
# One ring step's latency, assumed: Gloo over kernel TCP (the CPU stack here), NCCL over
# RDMA (RoCE or InfiniBand, as in Horovod's benchmark).
CPU_HOP_SECONDS, GPU_HOP_SECONDS = 25e-6, 5e-6
# https://github.com/horovod/horovod/blob/master/docs/benchmarks.rst: 128 servers x 4 Pascal
# GPUs on RoCE-capable 25 Gbit/s, 90% for ResNet-101; its example run, ResNet-101 at batch
# 64 per GPU on 16 GPUs, "total images/sec: 1656.82". ResNet-101 has 44.5 M parameters
# (torchvision's weights table).
RESNET101_PARAMETERS, RESNET101_IMAGES_PER_SECOND_16_GPUS = 44.5e6, 1656.82
RESNET101_BATCH = 64
ACCUMULATE, LARGER_BATCH = 4, 4


def hvd_mnist_inputs() -> tuple:
    """(gradients, training FLOPs per image) of hvd_mnist/training/model.py's model, float32."""
    from hvd_mnist.training import model as model_lib
    model = model_lib.build_model()
    return sm.model_gradients(model), flops.training_flops_per_image(model)["training"]


def k520_step_seconds() -> float:
    return K520_EPOCH_SECONDS / math.ceil(MNIST_TRAIN_IMAGES / BATCH)


def cases(report, gradients) -> list:
    """[(name, compute seconds at batch 128, stack)]."""
    gradient_bytes = sum(g.nbytes for g in gradients)
    k520 = k520_step_seconds()
    gpu = sm.Stack("NCCL", GPU_HOP_SECONDS, 0.0, overlap=True)
    return [("CPU, measured", report["baseline_1_host_1_worker"]["step_seconds"],
             sm.calibrated_stack(report, "Gloo", CPU_HOP_SECONDS, gradient_bytes)),
            ("GPU, K520 (published)", k520, gpu),
            ("GPU, V100 (derived)", k520 * K520_PEAK_FLOPS / V100_PEAK_FLOPS, gpu)]


# (name, step_seconds arguments, batch multiple, stack changes)
LEVERS = [("none", {}, 1, {}), ("fp16", {"precision": "fp16"}, 1, {}),
          (f"K={ACCUMULATE}", {"passes": ACCUMULATE}, 1, {}),
          (f"batch {LARGER_BATCH * BATCH}", {}, LARGER_BATCH, {}),
          (f"fp16+K={ACCUMULATE}", {"precision": "fp16", "passes": ACCUMULATE}, 1, {}),
          ("cycle 0.1 ms", {}, 1, {"cycle_seconds": 0.0001})]


def efficiency(compute, gradients, workers, gbit, stack, **kwargs) -> float:
    return sm.efficiency(compute, gradients, workers, gbit * 1e9, stack, **kwargs)


def reach(compute, gradients, gbit, stack, floor, **kwargs) -> str:
    """The most workers, 2 to 512, that keep `floor`: a number, "all" or "none"."""
    for workers in range(2, MOST_WORKERS + 1):
        if efficiency(compute, gradients, workers, gbit, stack, **kwargs) < floor:
            return str(workers - 1) if workers > 2 else "none"
    return "all"


def two_host_fit(report, gradients) -> list:
    """[(measured step, this model's step)] of each two-host row of make scaling: N = 2, the
    probe's stack and compute on that link, one fused buffer after backward."""
    stack = sm.calibrated_stack(report, "Gloo", CPU_HOP_SECONDS, sum(g.nbytes for g in gradients))
    fits = []
    for row in report["rows"]:
        precision, passes = scaling.lever_settings(row["flags"])
        model = sm.step_seconds(report["probes"][row["link"]]["compute_seconds"], gradients, 2,
                                row["link_bits_per_second"], stack, precision, passes=passes)
        fits.append((row["step_seconds"], model))
    return fits


def terms_ms(compute, gradients, workers, gbit, stack) -> list:
    """One fused fp32 buffer after backward: wire, stack, latency (ring and negotiation)."""
    nbytes = sum(g.nbytes for g in gradients)
    return [1000 * sm.wire_seconds(nbytes, workers, gbit * 1e9),
            1000 * sm.stack_seconds(nbytes, workers, stack.seconds_per_byte),
            1000 * (sm.ring_latency_seconds(workers, stack.hop_seconds)
                    + sm.negotiation_seconds(workers, stack.hop_seconds, stack.cycle_seconds))]


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=launch.REPO_ROOT)
    return result.stdout.strip() or "unknown"


def markdown(report, gradients, training_flops_per_image) -> str:
    all_cases = cases(report, gradients)
    links = " | ".join(f"{g} Gbit/s" for g in LINKS_GBIT)
    rule = "|---" * (len(LINKS_GBIT) + 2) + "|"
    nbytes = sum(g.nbytes for g in gradients)
    big = max(gradients, key=lambda g: g.nbytes)
    k520_flops = BATCH * training_flops_per_image / k520_step_seconds()
    errors = [model / measured - 1 for measured, model in two_host_fit(report, gradients)]
    lines = [
        f"Model inputs: {nbytes // 4:,} float32 parameters = {nbytes:,} gradient bytes "
        f"in {len(gradients)} tensors (hvd_mnist/training/model.py); reports/scaling.json of "
        f"{report['date']}, {report['machine'].split('), ')[0]}); commit {commit()}. "
        f"The largest tensor, {big.layer}'s kernel, {100 * big.nbytes / nbytes:.0f}% of the "
        f"bytes, is ready {100 * big.ready:.0f}% into a step's FLOPs.",
        f"At N = 2 the model is make scaling's fit: worst error over its "
        f"{len(errors)} measured rows {100 * max(map(abs, errors)):.0f}% "
        f"(target {100 * sm.TWO_HOST_TARGET:.0f}%).", "",
        "Compute per step of 128 images: " + "; ".join(
            f"{name} {1000 * compute:.1f} ms" for name, compute, _ in all_cases) + ". The K520 "
        f"figure is {BATCH * training_flops_per_image / 1e9:.1f} GFLOP per step at "
        f"{k520_flops / 1e9:.0f} GFLOP/s, {100 * k520_flops / K520_PEAK_FLOPS:.0f}% of its "
        f"{K520_PEAK_FLOPS / 1e12:.2f} TFLOP/s float32 peak.", "",
        f"Efficiency, no lever (images/s of N workers / N x one worker's):", "",
        f"| step | workers | {links} |", rule]
    for name, compute, stack in all_cases:
        for n in TABLE_WORKERS:
            cells = " | ".join(f"{100 * efficiency(compute, gradients, n, g, stack):.0f}%"
                               for g in LINKS_GBIT)
            lines.append(f"| {name} | {n} | {cells} |")
    lines += ["", "The most workers (2 to 512) that keep 90% / 50% efficiency:", "",
              f"| step | lever | {links} |", rule]
    for name, compute, stack in all_cases:
        for lever, kwargs, batch_factor, changes in LEVERS:
            lever_stack = dataclasses.replace(stack, **changes)
            cells = " | ".join(
                " / ".join(reach(compute * batch_factor, gradients, g, lever_stack, floor,
                                 **kwargs) for floor in (0.9, 0.5)) for g in LINKS_GBIT)
            lines.append(f"| {name} | {lever} | {cells} |")
    name, compute, stack = all_cases[2]
    serial = dataclasses.replace(stack, overlap=False)
    variants = [("fused, overlap", stack, True), ("per tensor, overlap", stack, False),
                ("fused, no overlap", serial, True), ("per tensor, no overlap", serial, False)]
    lines += ["", f"Tensor fusion and overlap, {name}, 25 Gbit/s, no lever (overlapped, the "
              f"{len(gradients)} tensors leave in {len(sm.groups(gradients, compute, stack))} "
              "groups):", "",
              "| workers | " + " | ".join(v for v, _, _ in variants) + " |",
              "|---" * (len(variants) + 1) + "|"]
    for n in (8, 64, 512):
        lines.append(f"| {n} | " + " | ".join(
            f"{100 * efficiency(compute, gradients, n, 25, s, fused=f):.0f}%"
            for _, s, f in variants) + " |")
    lines += ["", "Where the time goes at 512 workers, one fused fp32 buffer after backward "
              "(ms: wire / stack / latency):", "", f"| step | compute ms | {links} |", rule]
    for name, compute, stack in all_cases:
        lines.append(f"| {name} | {1000 * compute:.1f} | " + " | ".join(
            " / ".join(f"{t:.1f}" for t in terms_ms(compute, gradients, 512, g, stack))
            for g in LINKS_GBIT) + " |")
    resnet = [sm.Gradient("ResNet-101", int(RESNET101_PARAMETERS * 4), 1.0)]
    resnet_compute = RESNET101_BATCH / (RESNET101_IMAGES_PER_SECOND_16_GPUS / 16)
    no_overlap = dataclasses.replace(all_cases[1][2], overlap=False)
    lines += ["", f"Horovod's ResNet-101 case through the same model (compute "
              f"{1000 * resnet_compute:.0f} ms per step, {4 * RESNET101_PARAMETERS / 1e6:.0f} MB "
              f"of gradients, 25 Gbit/s, NCCL stack, nothing overlapped): "
              + ", ".join(f"{100 * sm.efficiency(resnet_compute, resnet, n, 25e9, no_overlap):.0f}%"
                          f" at {n}" for n in (128, 512)) + ". Gradient MB per second of "
              f"compute: ResNet-101 {4 * RESNET101_PARAMETERS / 1e6 / resnet_compute:.0f}; "
              + "; ".join(f"hvd_mnist, {name} {nbytes / 1e6 / compute:.0f}"
                          for name, compute, _ in all_cases) + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown(sm.load_report(), *hvd_mnist_inputs()))
