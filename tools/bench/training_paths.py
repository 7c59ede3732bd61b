"""Parts "paths" and "accuracy" of make bench: the custom loop and Keras fit at each -np
beside hvd_mnist's step alone in the bench's own process (the machine's practical limit),
and the training seconds each recipe and precision takes to reach 99.0% test accuracy."""

import math
import time

from tools.bench import launch, step_profile, steady_state, tables

THROUGHPUT_STEPS = 140  # per run: 7 windows, the first of which is dropped
TARGET_ACCURACY = 0.99
# Part accuracy's runs: each recipe on the custom loop in each precision; the seed on fit.
ACCURACY_RUNS = {
    "seed_custom": ["--mode=custom", "--precision=float32"],
    "seed_custom_mixed_bfloat16": ["--mode=custom", "--precision=mixed_bfloat16"],
    "seed_keras": ["--mode=keras"],
    "fast_custom": ["--mode=custom", "--recipe=fast", "--precision=float32"],
    "fast_custom_mixed_bfloat16": ["--mode=custom", "--recipe=fast", "--precision=mixed_bfloat16"]}
BATCH_SIZE = 128
QUIET = ["--log_every=0"]


def use_every_core() -> None:
    """This process's TF thread pools: one thread per core, set before its first op (TF
    refuses a change once its runtime has started)."""
    import os
    import tensorflow as tf
    threads = len(os.sched_getaffinity(0))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def step_alone_images_per_second(precision: str = "float32", windows: int = 7,
                                 window_steps: int = steady_state.WINDOW_STEPS) -> float:
    """hvd_mnist's training step with the default recipe's model and optimizer, no input
    pipeline (step_profile.tensorflow_step); images/s counted in windows as the trainers
    count them."""
    *_, step = step_profile.tensorflow_step("adadelta", 1.0, precision)
    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(window_steps):
            loss = step()
        float(loss)
        rates.append(window_steps * step_profile.BATCH / (time.perf_counter() - start))
    return steady_state.images_per_second(rates)


def throughput_flags(np_: int, steps: int = THROUGHPUT_STEPS) -> list:
    """--epochs and --max_steps_per_epoch for `steps` steps at np_ workers of 128: at -np 4
    an epoch has fewer steps than a measurement needs, so it takes two."""
    per_epoch = min(steps, launch.steps_in_epoch(np_, BATCH_SIZE))
    return [f"--epochs={math.ceil(steps / per_epoch)}", f"--max_steps_per_epoch={per_epoch}"]


def throughput_run(name: str, np_: int, run_flags: list, data_dir: str, out_dir: str) -> dict:
    run = launch.train(name, np_, [*run_flags, *throughput_flags(np_), *QUIET],
                       data_dir, out_dir, timeout_seconds=1800)
    print(f"{name}: {run['images_per_second']:.0f} images/s", flush=True)
    return run


def measure(results: dict, nps: list, data_dir: str, out_dir: str) -> None:
    """Part "paths" into results: float32's step alone (from the bench's screen,
    limit.screen_precisions, run first), and both paths at each -np."""
    results["step_alone_images_per_second"] = (
        results["precisions"]["step_alone_images_per_second"]["float32"])
    print(f"the step alone: {results['step_alone_images_per_second']:.0f} images/s", flush=True)
    runs = results["throughput"] = {}
    for np_ in nps:
        for mode in ("custom", "keras"):
            runs[f"{mode}_np{np_}"] = throughput_run(f"{mode}_np{np_}", np_, [f"--mode={mode}"],
                                                     data_dir, out_dir)
    ratios = results["ratios"] = {
        f"custom_over_keras_np{np_}": (runs[f"custom_np{np_}"]["images_per_second"]
                                       / runs[f"keras_np{np_}"]["images_per_second"])
        for np_ in nps}
    if 1 in nps:
        ratios["custom_np1_over_step_alone"] = (runs["custom_np1"]["images_per_second"]
                                                / results["step_alone_images_per_second"])


def table(results) -> str:
    f = tables.figure
    rows = [["hvd_mnist's step alone, 1 process", f(results["step_alone_images_per_second"]),
             "", ""]]
    rows += [[name, f(run["images_per_second"]), f(run["peak_rss_mib"]),
              f(run["launch_to_first_step_seconds"])]
             for name, run in results["throughput"].items()]
    return "\n".join([tables.markdown(["run", "images/s", "peak RSS MiB/rank",
                                       "launch to 1st step s"], rows),
                      "", "ratios: " + ", ".join(f"{name} {tables.ratio(value)}"
                                                 for name, value in results["ratios"].items())])


def accuracy_curve(summary: dict) -> list:
    """[(training seconds so far, test accuracy)] after each epoch (evaluation excluded)."""
    elapsed, curve = 0.0, []
    for record in summary["history"]:
        elapsed += record["train_seconds"]
        curve.append((elapsed, record["test_accuracy"]))
    return curve


def seconds_to_accuracy(curve: list, target: float = TARGET_ACCURACY):
    """(training seconds, epoch) of the first epoch at or above target; (None, None)."""
    return next(((seconds, epoch) for epoch, (seconds, accuracy) in enumerate(curve, start=1)
                 if accuracy >= target), (None, None))


def accuracy_run(name: str, run_flags: list, data_dir: str, out_dir: str) -> dict:
    """One -np 2 run that stops at TARGET_ACCURACY."""
    run = launch.train(name, 2, [*run_flags, f"--target_accuracy={TARGET_ACCURACY}", *QUIET],
                       data_dir, out_dir, timeout_seconds=3600)
    curve = accuracy_curve(run["summary"])
    seconds, epoch = seconds_to_accuracy(curve)
    return {"flags": run_flags, "training_seconds": seconds, "epoch": epoch, "curve": curve}


def accuracy_runs(skipped_precisions=()) -> dict:
    """ACCURACY_RUNS but those in a precision of skipped_precisions."""
    return {name: run_flags for name, run_flags in ACCURACY_RUNS.items()
            if not any(f"--precision={p}" in run_flags for p in skipped_precisions)}


def time_to_accuracy(data_dir: str, out_dir: str, skipped_precisions=()) -> dict:
    """Part "accuracy" at -np 2: each run's training seconds to 99.0%, and over the seed
    recipe's on the custom loop in float32; none in skipped_precisions."""
    out = {}
    for name, run_flags in accuracy_runs(skipped_precisions).items():
        out[name] = accuracy_run(f"accuracy_{name}", run_flags, data_dir, out_dir)
        print(f"time to {TARGET_ACCURACY:.1%} at -np 2, {name}: "
              f"{out[name]['training_seconds']} s (epoch {out[name]['epoch']})", flush=True)
    reference = out["seed_custom"]["training_seconds"]
    for result in out.values():
        seconds = result["training_seconds"]
        result["over_seed_custom"] = seconds / reference if seconds and reference else None
    return out


def accuracy_table(accuracy: dict) -> str:
    return tables.markdown(
        [f"time to {TARGET_ACCURACY:.1%} at -np 2", "training seconds", "over the seed recipe",
         "epoch", "test accuracy after each epoch"],
        [[name, tables.figure(a["training_seconds"]), tables.ratio(a["over_seed_custom"]),
          a["epoch"] or tables.MISSING,
          ", ".join(f"{100 * accuracy:.2f}%" for _, accuracy in a["curve"])]
         for name, a in accuracy.items()])


def plot_time_to_accuracy(accuracy: dict, out_path: str) -> None:
    from tools import plot
    plot.accuracy_over_time({name: result["curve"] for name, result in accuracy.items()},
                            out_path, f"time to {TARGET_ACCURACY:.1%} test accuracy at -np 2",
                            TARGET_ACCURACY)
