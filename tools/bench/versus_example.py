"""hvd_mnist against Horovod's own TF2 MNIST example (horovod_example.py), side by side.

Both train the same images: IMAGES_IN_ALL = 320 x 128, that is 320 / np steps of 128 per
worker, Adam 0.001 x workers. hvd_mnist runs as a user would start it (its defaults:
per-epoch evaluation of the 10,000 test images, a checkpoint, summary.json and the exported
model), the example as its file stands (a checkpoint at the end, nothing else). The runs
alternate, example first, `repeats` times for each -np, and the report gives medians:

  wall_seconds                  launch of horovodrun to its exit (the whole job)
  images_per_second             steady state over all workers: median of 20-step windows
                                after the first (the first holds tracing and warm-up)
  launch_to_first_step_seconds  launch of horovodrun to rank 0's first finished step
  peak_rss_mib                  the largest peak resident memory of any rank

and hvd_mnist's over the example's; with a baseline report (baselines.py), today's
ratio over the one it measured.

Part 5 of make bench; `python -m tools.bench --parts=versus` runs that part alone.
"""

import json
import os
import time

from tools.bench import baselines, launch, steady_state, tables, training_run

IMAGES_IN_ALL = 320 * 128
BATCH_SIZE = 128
TIMEOUT_SECONDS = 600


def run_example(np_, out_dir, idx_dir, steps=0, name=""):
    """One run of the example: `steps` per worker (0: this part's IMAGES_IN_ALL in all), its
    files in out_dir/name (example_np<N>)."""
    run_dir = os.path.join(out_dir, name or f"example_np{np_}")
    launch_unix = time.time()
    rc, seconds = launch.job(np_, launch.python_module(
        "tools.bench.horovod_example", f"--idx_dir={os.path.abspath(idx_dir)}",
        f"--steps={steps or IMAGES_IN_ALL // BATCH_SIZE // np_}",
        f"--out_dir={os.path.abspath(run_dir)}"), run_dir + ".log", TIMEOUT_SECONDS)
    if rc != 0:
        raise SystemExit(f"versus_example: the example failed ({rc}); see {run_dir}.log")
    ranks = []
    for rank in range(np_):
        with open(os.path.join(run_dir, f"rank{rank}.json")) as f:
            ranks.append(json.load(f))
    times = ranks[0]["step_unix_times"]
    return {"wall_seconds": seconds,
            "images_per_second": steady_state.images_per_second(
                steady_state.windows_from_step_times(times, BATCH_SIZE * np_)),
            "launch_to_first_step_seconds": times[0] - launch_unix,
            "peak_rss_mib": max(r["peak_rss_mib"] for r in ranks)}


def run_hvd_mnist(np_, out_dir, data_dir):
    run = training_run.measure(f"hvd_mnist_np{np_}", np_, [
        "--optimizer=adam", "--learning_rate=0.001", f"--batch_size={BATCH_SIZE}", "--epochs=1",
        f"--max_steps_per_epoch={IMAGES_IN_ALL // BATCH_SIZE // np_}"], data_dir, out_dir,
        TIMEOUT_SECONDS)
    return {**{key: run[key] for key in ("wall_seconds", "images_per_second",
                                         "launch_to_first_step_seconds")},
            "peak_rss_mib": max(run["peak_rss_mib_per_rank"]),
            "test_accuracy": run["summary"]["test_accuracy"]}


def compare(nps, repeats, out_dir, data_dir, idx_dir, baseline=None):
    """Per -np: every run's figures, their medians, hvd_mnist's over the example's, and
    (given a baseline report) that ratio over the baseline's."""
    baseline_ratios = baselines.versus_example_ratios(baseline) if baseline else {}
    out = {}
    for np_ in nps:
        programs = {"example": lambda: run_example(np_, out_dir, idx_dir),
                    "hvd_mnist": lambda: run_hvd_mnist(np_, out_dir, data_dir)}
        runs = {who: [] for who in programs}
        for _ in range(repeats):
            for who, run in programs.items():
                runs[who].append(run())
            print(f"np {np_}: " + ", ".join(f"{who} {rs[-1]['wall_seconds']:.1f} s"
                                          for who, rs in runs.items()), flush=True)
        medians = {who: steady_state.median_of_runs(rs) for who, rs in runs.items()}
        result = out[f"np{np_}"] = {
            "runs": runs, "median": medians,
            "hvd_mnist_over_example": steady_state.ratios(medians["hvd_mnist"],
                                                          medians["example"])}
        if f"np{np_}" in baseline_ratios:
            result["over_baseline"] = baselines.changes(result["hvd_mnist_over_example"],
                                                        baseline_ratios[f"np{np_}"])
    return out


LABELS = {"example": "Horovod's example", "hvd_mnist": "hvd_mnist"}
KEYS = ("wall_seconds", "images_per_second", "launch_to_first_step_seconds", "peak_rss_mib")


def table(comparison) -> str:
    rows = []
    for name, result in comparison.items():
        np_ = name[2:]
        rows += [[np_, LABELS[who], *(tables.figure(median[k]) for k in KEYS)]
                 for who, median in result["median"].items()]
        for key, label in (("hvd_mnist_over_example", "hvd_mnist / example"),
                           ("over_baseline", "that / the baseline's")):
            if key in result:
                rows.append([np_, f"**{label}**",
                             *(tables.ratio(result[key].get(k)) for k in KEYS)])
    return tables.markdown(["-np", "run", "whole process s", "steady images/s",
                            "launch to 1st step s", "peak RSS MiB/rank"], rows)
