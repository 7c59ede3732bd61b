"""Part 6 of make bench, "the limit": each --precision's training step against what this
machine's cores can do at all.

  1. The model's FLOPs per training image, counted from its layers' shapes (flops.py).
  2. The machine's peak, in this process on every core: a 2048 x 2048 matmul, and the
     model's own second convolution (a batch of 128, forward), in float32, bfloat16 and
     float16. The peak of a dtype is the higher of the two: a matmul is what the cores
     usually do fastest, but oneDNN's convolution kernels can beat it.
  3. The custom loop in each precision at each -np (make bench's part 2 runs: 140 steps
     of 128 per worker): images/s, achieved GFLOP/s (images/s x training FLOPs per image)
     and its fraction of the peak of the dtype its layers compute in; Horovod's
     own example (float32) at the same -np, in the same run.
  4. Time to 99.0% test accuracy at -np 2 in each precision (the seed recipe).

`python -m tools.bench --parts=limit` runs this part alone (reports/bench_limit.json).
"""

import time

from tools.bench import flops, tables, training_paths, training_run, versus_example

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# The dtype a precision's convolutions and matmuls run in (its variables stay float32).
COMPUTE_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16",
                 "mixed_float16": "float16"}
MATMUL_SIZE = 2048
CONV_BATCH = 128


def _rate(op, flops_per_call: float, seconds: float = 2.0) -> float:
    """GFLOP/s of op() after a warm-up call, over at least `seconds`."""
    op().numpy()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = op()
        calls += 1
    result.numpy()
    return calls * flops_per_call / (time.perf_counter() - start) / 1e9


def peaks() -> dict:
    """{dtype: {"matmul": GFLOP/s, "conv": GFLOP/s}} in this process, every core."""
    import tensorflow as tf
    out = {}
    for dtype in COMPUTE_DTYPE.values():
        a = tf.random.uniform([MATMUL_SIZE, MATMUL_SIZE], dtype=tf.float32)
        a = tf.cast(a, dtype)
        images = tf.cast(tf.random.uniform([CONV_BATCH, 26, 26, 32]), dtype)
        kernel = tf.cast(tf.random.uniform([3, 3, 32, 64]), dtype)
        matmul = tf.function(lambda: tf.matmul(a, a))
        conv = tf.function(lambda: tf.nn.conv2d(images, kernel, 1, "VALID"))
        conv_flops = 2 * CONV_BATCH * 24 * 24 * 64 * 3 * 3 * 32
        out[dtype] = {"matmul": _rate(matmul, 2 * MATMUL_SIZE ** 3),
                      "conv": _rate(conv, conv_flops)}
        print(f"limit: {dtype} peak: matmul {out[dtype]['matmul']:.0f} GFLOP/s, the model's "
              f"convolution {out[dtype]['conv']:.0f} GFLOP/s", flush=True)
    return out


def measure(nps: list, steps: int, data_dir: str, idx_dir: str, out_dir: str,
            accuracy: bool = True) -> dict:
    from hvd_mnist.training import model as model_lib
    cost = flops.training_flops_per_image(model_lib.build_model())
    results = {"flops_per_image": cost, "peak_gflops": peaks(), "runs": {}, "example": {}}
    for np_ in nps:
        results["example"][f"np{np_}"] = versus_example.run_example(np_, out_dir, idx_dir)
        for precision in PRECISIONS:
            name = f"{precision}_np{np_}"
            run = training_run.measure(
                f"limit_{name}", np_, [f"--precision={precision}",
                                      *training_paths.throughput_flags(np_, steps),
                                      *training_paths.QUIET], data_dir, out_dir,
                timeout_seconds=1800)
            gflops = run["images_per_second"] * cost["training"] / 1e9
            peak = max(results["peak_gflops"][COMPUTE_DTYPE[precision]].values())
            results["runs"][name] = {"np": np_, "precision": precision,
                                     "images_per_second": run["images_per_second"],
                                     "gflops": gflops, "fraction_of_peak": gflops / peak}
            print(f"limit: {name}: {run['images_per_second']:.0f} images/s, {gflops:.0f} "
                  f"GFLOP/s, {gflops / peak:.0%} of the peak", flush=True)
    results["bfloat16_over_float32"] = {
        f"np{np_}": (results["runs"][f"mixed_bfloat16_np{np_}"]["images_per_second"]
                     / results["runs"][f"float32_np{np_}"]["images_per_second"])
        for np_ in nps}
    if accuracy:
        results["time_to_accuracy"] = time_to_accuracy(data_dir, out_dir)
    return results


def time_to_accuracy(data_dir: str, out_dir: str) -> dict:
    out = {}
    for precision in PRECISIONS:
        run = training_run.measure(
            f"limit_accuracy_{precision}", 2,
            [f"--precision={precision}", f"--target_accuracy={training_paths.TARGET_ACCURACY}",
             *training_paths.QUIET], data_dir, out_dir, timeout_seconds=3600)
        seconds, epoch = training_paths.seconds_to_accuracy(run["summary"])
        out[precision] = {"training_seconds": seconds, "epoch": epoch,
                          "final_test_accuracy": run["summary"]["test_accuracy"]}
        print(f"limit: time to {training_paths.TARGET_ACCURACY:.1%} at -np 2, {precision}: "
              f"{seconds} s (epoch {epoch})", flush=True)
    return out


def table(results: dict) -> str:
    f, cost = tables.figure, results["flops_per_image"]
    layers = ", ".join(f"{name} {value / 1e6:.2f}" for name, value in
                       cost["per_layer_forward"].items())
    lines = [f"The model: {cost['forward'] / 1e6:.1f} MFLOP forward per image ({layers}), "
             f"{cost['training'] / 1e6:.1f} MFLOP per training image (tools/bench/flops.py).",
             "",
             tables.markdown(["peak, every core, this process", "matmul GFLOP/s",
                              "the model's convolution GFLOP/s"],
                             [[dtype, f(p["matmul"]), f(p["conv"])]
                              for dtype, p in results["peak_gflops"].items()]), ""]
    rows = []
    for name, run in results["runs"].items():
        rows.append([name, f(run["images_per_second"]), f(run["gflops"]),
                     f"{100 * run['fraction_of_peak']:.0f}%"])
    for name, example in results["example"].items():
        rows.append([f"Horovod's example, float32, {name}", f(example["images_per_second"]),
                     f(example["images_per_second"] * cost["training"] / 1e9), ""])
    lines += [tables.markdown(["custom loop", "images/s", "GFLOP/s",
                               "of its dtype's peak"], rows), "",
              "bfloat16 over float32: " + tables.named_ratios(results["bfloat16_over_float32"])]
    if "time_to_accuracy" in results:
        lines += ["", tables.markdown(
            [f"time to {training_paths.TARGET_ACCURACY:.1%} at -np 2", "training seconds",
             "epoch", "final test accuracy"],
            [[p, f(a["training_seconds"]), a["epoch"] or tables.MISSING,
              f"{100 * a['final_test_accuracy']:.2f}%"]
             for p, a in results["time_to_accuracy"].items()])]
    return "\n".join(lines)
