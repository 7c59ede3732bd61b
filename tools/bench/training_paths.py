"""Parts 1-3 of make bench: the custom loop and Keras fit at each -np, beside plain TF
and the input pipeline measured in the bench's own process, and the time each takes to
reach 99.0% test accuracy."""

import math

from tools.bench import in_process, tables, training_run

THROUGHPUT_STEPS = 140  # per run: 7 windows, the first of which is dropped
TARGET_ACCURACY = 0.99
QUIET = ["--log_every=0"]


def throughput_flags(np_: int, steps: int) -> list:
    """--epochs and --max_steps_per_epoch for `steps` steps at np_ workers of 128: at -np 4
    an epoch has fewer steps than a measurement needs, so it takes two."""
    per_epoch = min(steps, 60_000 // (128 * np_))
    return [f"--epochs={math.ceil(steps / per_epoch)}", f"--max_steps_per_epoch={per_epoch}"]


def measure(results: dict, nps: list, steps: int, data_dir: str, out_dir: str) -> None:
    """Parts 1 and 2 into results: plain TF, the pipeline, and both paths at each -np."""
    results["plain_tf_images_per_second"] = in_process.plain_tf_images_per_second(128)
    results["pipeline_images_per_second_per_rank"] = in_process.pipeline_images_per_second(
        data_dir, 128, size=2)
    print(f"plain TF: {results['plain_tf_images_per_second']:.0f} images/s; input pipeline: "
          f"{results['pipeline_images_per_second_per_rank']:.0f} images/s per rank", flush=True)
    runs = results["throughput"] = {}
    for np_ in nps:
        for mode in ("custom", "keras"):
            name = f"{mode}_np{np_}"
            runs[name] = training_run.measure(
                name, np_, [f"--mode={mode}", *throughput_flags(np_, steps), *QUIET],
                data_dir, out_dir, timeout_seconds=900)
            print(f"{name}: {runs[name]['images_per_second']:.0f} images/s", flush=True)
    results["ratios"] = ratios(results, nps)


def seconds_to_accuracy(summary, target=TARGET_ACCURACY):
    """Training seconds (evaluation excluded) until the first epoch at or above target."""
    elapsed = 0.0
    for record in summary["history"]:
        elapsed += record["train_seconds"]
        if record["test_accuracy"] >= target:
            return elapsed, record["epoch"]
    return None, None


def accuracy_curve(summary: dict) -> list:
    """[(training seconds so far, test accuracy)] after each epoch."""
    elapsed, curve = 0.0, []
    for record in summary["history"]:
        elapsed += record["train_seconds"]
        curve.append((elapsed, record["test_accuracy"]))
    return curve


def accuracy_run(name: str, run_flags: list, data_dir: str, out_dir: str,
                 timeout_seconds: float) -> dict:
    """One -np 2 run that stops at TARGET_ACCURACY: its training seconds to get there,
    the epoch, its final accuracy and its accuracy after every epoch."""
    run = training_run.measure(name, 2, [*run_flags, f"--target_accuracy={TARGET_ACCURACY}",
                                         *QUIET], data_dir, out_dir,
                               timeout_seconds=timeout_seconds)
    seconds, epoch = seconds_to_accuracy(run["summary"])
    return {"flags": run["flags"], "training_seconds": seconds, "epoch": epoch,
            "final_test_accuracy": run["summary"]["test_accuracy"],
            "curve": accuracy_curve(run["summary"])}


# Part 3's runs; "limit" takes the float32 custom ones from here rather than run them again.
ACCURACY_RUNS = {"seed_custom": ["--mode=custom"], "seed_keras": ["--mode=keras"],
                 "fast_custom": ["--mode=custom", "--recipe=fast"]}


def time_to_accuracy(data_dir: str, out_dir: str) -> dict:
    """Part 3: the seed recipe on both paths and --recipe=fast on the custom loop, -np 2."""
    accuracy = {}
    for name, run_flags in ACCURACY_RUNS.items():
        accuracy[name] = accuracy_run(f"accuracy_{name}", run_flags, data_dir, out_dir,
                                      timeout_seconds=1800)
        print(f"time to {TARGET_ACCURACY:.1%} at -np 2, {name}: "
              f"{accuracy[name]['training_seconds']} s (epoch {accuracy[name]['epoch']})",
              flush=True)
    return accuracy


def ratios(results, nps):
    runs = results["throughput"]
    out = {}
    for np_ in nps:
        out[f"custom_over_keras_np{np_}"] = (runs[f"custom_np{np_}"]["images_per_second"]
                                             / runs[f"keras_np{np_}"]["images_per_second"])
    if 1 in nps:
        custom1 = runs["custom_np1"]["images_per_second"]
        out["custom_np1_over_plain_tf"] = custom1 / results["plain_tf_images_per_second"]
        out["pipeline_over_training_np1"] = (results["pipeline_images_per_second_per_rank"]
                                             / custom1)
    if 2 in nps:
        per_rank = runs["custom_np2"]["images_per_second"] / 2
        out["pipeline_over_training_per_rank_np2"] = (
            results["pipeline_images_per_second_per_rank"] / per_rank)
    return out


def table(results):
    """Parts 1 and 2 (the largest rank's peak RSS), and the ratios."""
    f = tables.figure
    rows = [["plain TF, 1 process, no Horovod", f(results["plain_tf_images_per_second"]),
             "", "", "", ""],
            ["input pipeline alone, per rank",
             f(results["pipeline_images_per_second_per_rank"]), "", "", "", ""]]
    rows += [[name, f(run["images_per_second"]), f(max(run["peak_rss_mib_per_rank"])),
              f(run["launch_to_first_step_seconds"]), f(run["last_step_to_exit_seconds"]),
              f(run["summary_to_exit_seconds"])]
             for name, run in results["throughput"].items()]
    lines = [tables.markdown(["run", "images/s", "peak RSS MiB/rank", "launch to 1st step s",
                              "last step to exit s", "summary to exit s"], rows),
             "", "ratios: " + tables.named_ratios(results["ratios"])]
    if "ratios_over_baseline" in results:
        lines += ["", "each over the baseline's: "
                  + tables.named_ratios(results["ratios_over_baseline"])]
    return "\n".join(lines)


def accuracy_table(accuracy: dict) -> str:
    return tables.markdown(
        [f"time to {TARGET_ACCURACY:.1%} test accuracy at -np 2", "training seconds", "epoch"],
        [[name, tables.figure(value["training_seconds"]), value["epoch"] or tables.MISSING]
         for name, value in accuracy.items()])
