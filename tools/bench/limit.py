"""Part 6 of make bench, "the limit": each --precision's training step against what this
machine's cores can do at all.

  1. The model's FLOPs per training image, counted from its layers' shapes (flops.py).
  2. The machine's peak, in this process on every core: a 2048 x 2048 matmul, and the
     model's own second convolution (a batch of 128, forward), in float32, bfloat16 and
     float16. The peak of a dtype is the higher of the two: a matmul is what the cores
     usually do fastest, but oneDNN's convolution kernels can beat it.
  3. Where one step's time goes in each precision, in this process (step_breakdown.py):
     each layer's forward and backward pass, the loss and the optimizer apart, each
     FLOP-bearing layer's GFLOP/s against the peak.
  4. The custom loop in each precision at each -np (make bench's part 2 runs: 140 steps
     of 128 per worker): images/s, achieved GFLOP/s (images/s x training FLOPs per image)
     and its fraction of the peak of the dtype its layers compute in; Horovod's
     own example (float32) at the same -np, in the same run.
  5. Time to 99.0% test accuracy at -np 2 in each precision, with the seed recipe and
     with --recipe=fast.
A precision whose step runs at under SKIP_BELOW of float32's in step 3 (float16 on CPUs:
oneDNN has no fast float16 kernels for them) is left out of steps 4 and 5, with the
reason in the report: on some CPUs its runs alone would take hours.

`python -m tools.bench --parts=limit` runs this part alone (reports/bench_limit.json).
"""

from tools.bench import (flops, step_breakdown, tables, training_paths, training_run,
                         versus_example)

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# The dtype a precision's convolutions and matmuls run in (its variables stay float32).
COMPUTE_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16",
                 "mixed_float16": "float16"}
MATMUL_SIZE = 2048
CONV_BATCH = 128
SKIP_BELOW = 0.25
RECIPES = {"seed": [], "fast": ["--recipe=fast"]}


def _rate(op, flops_per_call: float, seconds: float = 2.0) -> float:
    """GFLOP/s of op() after its warm-up calls, over at least `seconds`."""
    return flops_per_call / step_breakdown.seconds_per_call(op, seconds) / 1e9


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


def peak(results: dict, precision: str) -> float:
    """The peak GFLOP/s of the dtype a precision computes in: matmul or convolution."""
    return max(results["peak_gflops"][COMPUTE_DTYPE[precision]].values())


def measure(nps: list, steps: int, data_dir: str, idx_dir: str, out_dir: str,
            accuracy: bool = True, float32_accuracy_runs: dict | None = None) -> dict:
    from hvd_mnist.training import model as model_lib
    cost = flops.training_flops_per_image(model_lib.build_model())
    results = {"flops_per_image": cost, "peak_gflops": peaks(), "breakdown": {},
               "skipped": {}, "runs": {}, "example": {}}
    for precision in PRECISIONS:
        breakdown = step_breakdown.summarise(step_breakdown.measure(precision),
                                             peak(results, precision))
        results["breakdown"][precision] = breakdown
        print(f"limit: {precision} step in one process: "
              f"{breakdown['images_per_second']:.0f} images/s", flush=True)
    results["skipped"] = too_slow(results["breakdown"])
    measured = [p for p in PRECISIONS if p not in results["skipped"]]
    for np_ in nps:
        results["example"][f"np{np_}"] = versus_example.run_example(np_, out_dir, idx_dir)
        for precision in measured:
            name = f"{precision}_np{np_}"
            run = training_run.measure(
                f"limit_{name}", np_, [f"--precision={precision}",
                                      *training_paths.throughput_flags(np_, steps),
                                      *training_paths.QUIET], data_dir, out_dir,
                timeout_seconds=1800)
            gflops = run["images_per_second"] * cost["training"] / 1e9
            results["runs"][name] = {"np": np_, "precision": precision,
                                     "images_per_second": run["images_per_second"],
                                     "gflops": gflops,
                                     "fraction_of_peak": gflops / peak(results, precision)}
            print(f"limit: {name}: {run['images_per_second']:.0f} images/s, {gflops:.0f} "
                  f"GFLOP/s, {gflops / peak(results, precision):.0%} of the peak", flush=True)
    if "mixed_bfloat16" in measured:
        results["bfloat16_over_float32"] = {
            f"np{np_}": (results["runs"][f"mixed_bfloat16_np{np_}"]["images_per_second"]
                         / results["runs"][f"float32_np{np_}"]["images_per_second"])
            for np_ in nps}
    if accuracy:
        results["time_to_accuracy"] = time_to_accuracy(measured, data_dir, out_dir,
                                                       float32_accuracy_runs)
    return results


def plot_time_to_accuracy(time_to_accuracy: dict, out_path: str) -> None:
    from tools.bench import plot
    target = training_paths.TARGET_ACCURACY
    plot.accuracy_over_time({name: result["curve"] for name, result in time_to_accuracy.items()},
                            out_path, f"time to {target:.1%} test accuracy at -np 2", target)


def too_slow(breakdowns: dict) -> dict:
    """{precision: why it is not run under Horovod} for each precision whose step ran at
    under SKIP_BELOW of float32's in one process."""
    float32_rate = breakdowns["float32"]["images_per_second"]
    out = {}
    for precision, breakdown in breakdowns.items():
        ratio = breakdown["images_per_second"] / float32_rate
        if ratio < SKIP_BELOW:
            out[precision] = (f"not run under Horovod: its step ran at {ratio:.2f}x "
                              "float32's in one process")
    return out


def time_to_accuracy(precisions: list, data_dir: str, out_dir: str,
                     float32_runs: dict | None = None) -> dict:
    """{"<recipe>_<precision>": training seconds to 99.0% at -np 2, ...}; and each one's
    ratio to the seed recipe in float32, this run's reference. float32_runs: part 3's
    results (training_paths.time_to_accuracy), whose float32 custom-loop runs are the same
    runs as a recipe's float32 here and are taken instead of running them again."""
    earlier = {f"{recipe}_float32": (float32_runs or {}).get(f"{recipe}_custom")
               for recipe in RECIPES}
    out = {}
    for recipe, recipe_flags in RECIPES.items():
        for precision in precisions:
            name = f"{recipe}_{precision}"
            result = earlier.get(name) or training_paths.accuracy_run(
                f"limit_accuracy_{name}", [*recipe_flags, f"--precision={precision}"],
                data_dir, out_dir, timeout_seconds=3600)
            out[name] = {"recipe": recipe, "precision": precision, **result}
            print(f"limit: time to {training_paths.TARGET_ACCURACY:.1%} at -np 2, {name}: "
                  f"{result['training_seconds']} s (epoch {result['epoch']})", flush=True)
    reference = out["seed_float32"]["training_seconds"]
    for result in out.values():
        seconds = result["training_seconds"]
        result["over_seed_float32"] = (seconds / reference if seconds and reference
                                       else None)
    return out


def percent(fraction) -> str:
    return tables.MISSING if fraction is None else f"{100 * fraction:.0f}%"


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
    lines += [breakdown_table(results["breakdown"], cost["training"]), ""]
    rows = []
    for name, run in results["runs"].items():
        rows.append([name, f(run["images_per_second"]), f(run["gflops"]),
                     percent(run["fraction_of_peak"])])
    for precision, reason in results["skipped"].items():
        rows.append([precision, tables.MISSING, tables.MISSING, reason])
    for name, example in results["example"].items():
        rows.append([f"Horovod's example, float32, {name}", f(example["images_per_second"]),
                     f(example["images_per_second"] * cost["training"] / 1e9), ""])
    lines += [tables.markdown(["custom loop", "images/s", "GFLOP/s",
                               "of its dtype's peak"], rows)]
    if "bfloat16_over_float32" in results:
        lines += ["", "bfloat16 over float32: "
                  + tables.named_ratios(results["bfloat16_over_float32"])]
    if "time_to_accuracy" in results:
        lines += ["", tables.markdown(
            [f"time to {training_paths.TARGET_ACCURACY:.1%} at -np 2", "training seconds",
             "over the seed in float32", "epoch", "test accuracy after each epoch"],
            [[name, f(a["training_seconds"]), tables.ratio(a["over_seed_float32"]),
              a["epoch"] or tables.MISSING,
              ", ".join(f"{100 * accuracy:.2f}%" for _, accuracy in a["curve"])]
             for name, a in results["time_to_accuracy"].items()])]
    return "\n".join(lines)


def breakdown_table(breakdowns: dict, training_flops: float) -> str:
    """Step 3: one column pair (share of the step, GFLOP/s and share of the peak) per
    precision, one row per piece."""
    f = tables.figure
    precisions = list(breakdowns)
    header = ["one step of 128 in one process"]
    for precision in precisions:
        header += [f"{precision}: ms", "share of the step", "GFLOP/s (of peak)"]
    rows = []
    for index, piece in enumerate(breakdowns[precisions[0]]["pieces"]):
        row = [piece["name"]]
        for precision in precisions:
            p = breakdowns[precision]["pieces"][index]
            gflops = (f"{f(p['gflops'])} ({percent(p['fraction_of_peak'])})"
                      if p["gflops"] else "")
            row += [f(1e3 * p["seconds"]), percent(p["share_of_step"]), gflops]
        rows.append(row)
    for label, key in (("the pieces, each timed alone, added up", "pieces_seconds"),
                       ("the whole step", "step")):
        row = [label]
        for precision in precisions:
            b = breakdowns[precision]
            share = b[key] / b["step"]
            gflops = ""
            if key == "step":
                achieved = b["images_per_second"] * training_flops / 1e9
                gflops = f"{f(achieved)} ({percent(achieved / b['peak_gflops'])})"
            row += [f(1e3 * b[key]), percent(share), gflops]
        rows.append(row)
    shares = ", ".join(f"{precision} {percent(b['flop_bearing_share'])}"
                       for precision, b in breakdowns.items())
    return (tables.markdown(header, rows) + "\n\nTimed alone, each piece also pays its own "
            "dispatch, so the pieces add up to more than the step. Share of the step in the "
            f"layers that do the FLOPs (convolutions and dense layers, forward and backward): "
            f"{shares}.")
