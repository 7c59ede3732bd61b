"""Side-by-side benchmark of the training paths on this machine: `make bench`.

One run measures, in this order, and writes a table plus reports/bench.json:
  1. a plain single-process tf.function step of the same model, no Horovod
     (the machine's practical limit), and the input pipeline alone;
  2. steady-state training throughput of the custom loop and of Keras fit at
     -np 1, 2 and 4: images/s over all ranks, median of 20-step windows with the
     first window (tracing, warm-up) dropped; peak resident memory per rank;
     time from launch to the first finished step; time from the last step to exit;
  3. time to 99.0% test accuracy at -np 2: the seed recipe on both paths and
     `--recipe=fast` on the custom loop (training seconds, evaluation excluded);
  4. each input mode (--input=memory, stream, files) at -np 2: rank 0's input
     pipeline alone (images/s), record bytes a rank reads per epoch, and a short
     training run's images/s and peak RSS per rank (`--only_inputs`: this part alone);
  5. hvd_mnist against Horovod's own TF2 example (versus_example.py) at -np 1, 2
     and 4, and how that ratio moved since the baseline report (--baseline_report,
     baselines.py); then the step's levers (step_levers.py) at -np 2, and one
     vs two TF threads per rank at -np 2 and 4 (`--only_versus`: this part alone).
Writes reports/bench.json and reports/bench.md (the README's performance tables).
About 30 minutes on a 2-core machine.
"""

import json
import math
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from hvd_mnist.outputs.timing import WINDOW_STEPS  # noqa: E402  the trainers' window, for plain TF too
from tools.bench import baselines, launch, machine, steady_state, versus_example  # noqa: E402

THROUGHPUT_STEPS = 140  # per run: 7 windows, the first of which is dropped
TARGET_ACCURACY = 0.99


def use_every_core() -> None:
    """This process's TF thread pools (plain TF, the input pipelines): one thread per core.
    Before its first TF op: TF refuses a change once its runtime has started."""
    import tensorflow as tf
    threads = len(os.sched_getaffinity(0))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def plain_tf_images_per_second(batch_size: int, windows: int = 7) -> float:
    """The same model and optimizer in one process, no Horovod, synthetic batches, counted
    in the trainers' windows."""
    import tensorflow as tf
    from hvd_mnist.training import model as model_lib

    tf.keras.utils.set_random_seed(0)
    model = model_lib.build_model()
    optimizer = model_lib.make_optimizer("adadelta", 1.0)
    optimizer.build(model.trainable_variables)
    loss_fn = model_lib.make_loss()
    images = tf.random.uniform([batch_size, 28, 28, 1])
    labels = tf.random.uniform([batch_size], maxval=10, dtype=tf.int64)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return loss

    rates = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(WINDOW_STEPS):
            loss = step(images, labels)
        float(loss)
        rates.append(WINDOW_STEPS * batch_size / (time.perf_counter() - start))
    return steady_state.images_per_second(rates)


def pipeline_images_per_second(data_dir: str, batch_size: int, size: int,
                               mode: str = "memory") -> float:
    """Rank 0's training input for one epoch at `size` ranks, with nothing consuming it."""
    from hvd_mnist.data import inputs
    source = inputs.open_input(mode, data_dir, inputs.Shard(0, size), shuffle_buffer=60_000)
    steps = source.usable_train_examples() // (batch_size * size)
    batches = iter(source.train_batches(seed=0, epoch=1, steps=steps,
                                        per_rank_batch_size=batch_size))
    # Start-up excluded: loading the split (memory) or filling the shuffle buffer (stream,
    # files) happens once per run or per epoch; the rate is the steady state after it.
    next(batches)
    start, images = time.perf_counter(), 0
    for batch_images, _ in batches:
        images += int(batch_images.shape[0])
    return images / (time.perf_counter() - start)


def launch_run(name, np_, flags, data_dir, out_dir, timeout_seconds):
    model_dir = os.path.join(out_dir, name)
    args = ["-m", "hvd_mnist.main", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
            "--log_every=0", *flags]
    launch_unix = time.time()
    rc, seconds = launch.job(np_, [sys.executable, *args], os.path.join(out_dir, f"{name}.log"),
                             timeout_seconds)
    exit_unix = time.time()
    if rc != 0:
        sys.exit(f"bench: run {name} failed ({rc}); see {out_dir}/{name}.log")
    summary = launch.read_summary(model_dir)
    timing = summary["timing"]
    return {
        "np": np_, "flags": flags, "summary": summary,
        "images_per_second": steady_state.images_per_second(timing["window_images_per_second"]),
        "peak_rss_mib_per_rank": summary["peak_rss_mib_per_rank"],
        "launch_to_first_step_seconds": timing["first_step_unix_time"] - launch_unix,
        "last_step_to_exit_seconds": exit_unix - timing["last_step_unix_time"],
        # After the final evaluation, checkpoint and summary: shutdown alone.
        "summary_to_exit_seconds": exit_unix - timing["summary_unix_time"],
        "launch_seconds": seconds,
    }


def seconds_to_accuracy(summary, target=TARGET_ACCURACY):
    """Training seconds (evaluation excluded) until the first epoch at or above target."""
    elapsed = 0.0
    for record in summary["history"]:
        elapsed += record["train_seconds"]
        if record["test_accuracy"] >= target:
            return elapsed, record["epoch"]
    return None, None


def define_flags():
    flags.DEFINE_string("data_dir", "data/tfds", "The prepared mnist (make data).")
    flags.DEFINE_string("out_dir", "runs/bench", "Where the runs and their logs go.")
    flags.DEFINE_string("report", "reports/bench.json", "The JSON report; the Markdown "
                        "tables go beside it (.md).")
    flags.DEFINE_list("nps", ["1", "2", "4"], "Numbers of workers of parts 2 and 5.")
    flags.register_validator("nps", lambda v: all(n.isdigit() and int(n) > 0 for n in v),
                             message="--nps must be positive integers, e.g. 1,2,4")
    flags.DEFINE_integer("throughput_steps", THROUGHPUT_STEPS, "Steps of each part 2 run.",
                         lower_bound=2 * WINDOW_STEPS)
    flags.DEFINE_bool("skip_accuracy", False, "Skip the time-to-99% runs (the longest part).")
    flags.DEFINE_string("sharded_data_dir", "data/tfds-sharded", "The same dataset in 8 "
                        "files per split, for --input=files (make data-sharded).")
    flags.DEFINE_bool("only_inputs", False, "Measure the input modes only (part 4).")
    flags.DEFINE_bool("only_versus", False, "Measure against Horovod's example and the "
                      "levers only (part 5).")
    flags.DEFINE_string("idx_dir", "data/cache/idx", "The IDX files make data writes: the "
                        "example's data.")
    flags.DEFINE_integer("versus_repeats", 3, "Alternating runs of each program per -np "
                         "in part 5.", lower_bound=1)
    flags.DEFINE_string("baseline_report", "reports/bench.json", "An earlier make bench "
                        "report whose ratios this run's are set beside (read before this "
                        "run writes its own; a missing file: no baseline).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    args = flags.FLAGS
    nps = [int(n) for n in args.nps]
    started = time.perf_counter()
    use_every_core()

    results = {"machine": machine.description(), "date": machine.now()}
    baseline = baselines.load(args.baseline_report)
    if baseline:
        results["baseline"] = baselines.provenance(baseline, args.baseline_report)
    if args.only_versus:
        versus(args, nps, results, baseline)
        return write_reports(args, results, started)
    results["input_modes"] = input_modes(args)
    print(input_table(results["input_modes"]), flush=True)
    if args.only_inputs:
        report_path = args.report.replace(".json", "_inputs.json")
        results["bench_seconds"] = time.perf_counter() - started
        with open(report_path, "w") as f:
            json.dump(results, f, indent=2)
        print(f"bench: {results['bench_seconds']:.0f} s; wrote {report_path}")
        return

    results["plain_tf_images_per_second"] = plain_tf_images_per_second(128)
    results["pipeline_images_per_second_per_rank"] = pipeline_images_per_second(
        args.data_dir, 128, size=2)
    print(f"plain TF: {results['plain_tf_images_per_second']:.0f} images/s; input pipeline: "
          f"{results['pipeline_images_per_second_per_rank']:.0f} images/s per rank", flush=True)

    runs = results["throughput"] = {}
    for np_ in nps:
        for mode in ("custom", "keras"):
            name = f"{mode}_np{np_}"
            # At -np 4 an epoch has fewer steps than a measurement needs: use two.
            steps = min(args.throughput_steps, 60_000 // (128 * np_))
            epochs = math.ceil(args.throughput_steps / steps)
            runs[name] = launch_run(name, np_, [f"--mode={mode}", f"--epochs={epochs}",
                                                f"--max_steps_per_epoch={steps}"],
                                    args.data_dir, args.out_dir, timeout_seconds=900)
            print(f"{name}: {runs[name]['images_per_second']:.0f} images/s", flush=True)

    if not args.skip_accuracy:
        accuracy = results["time_to_accuracy"] = {}
        target_flag = f"--target_accuracy={TARGET_ACCURACY}"
        for name, run_flags in [("seed_custom", ["--mode=custom"]),
                                ("seed_keras", ["--mode=keras"]),
                                ("fast_custom", ["--mode=custom", "--recipe=fast"])]:
            run = launch_run(f"accuracy_{name}", 2, [*run_flags, target_flag], args.data_dir,
                             args.out_dir, timeout_seconds=1800)
            seconds, epoch = seconds_to_accuracy(run["summary"])
            accuracy[name] = {"training_seconds": seconds, "epoch": epoch,
                              "final_test_accuracy": run["summary"]["test_accuracy"],
                              "flags": run["flags"]}
            print(f"time to {TARGET_ACCURACY:.1%} at -np 2, {name}: {seconds} s (epoch {epoch})",
                  flush=True)

    results["ratios"] = ratios(results, nps)
    if baseline and "ratios" in baseline:
        results["ratios_over_baseline"] = baselines.changes(results["ratios"],
                                                            baseline["ratios"])
    versus(args, nps, results, baseline)
    write_reports(args, results, started)


def write_reports(args, results, started):
    """reports/bench.json, and reports/bench.md with every table this run printed."""
    results["bench_seconds"] = time.perf_counter() - started
    os.makedirs(os.path.dirname(args.report) or ".", exist_ok=True)
    with open(args.report, "w") as f:
        json.dump(results, f, indent=2)
    tables = [f"`make bench` on {results['machine']}, {results['date']} "
              f"({results['bench_seconds']:.0f} s).", ""]
    if "throughput" in results:
        tables.append(table(results, sorted({r["np"] for r in results["throughput"].values()})))
        tables.append(input_table(results["input_modes"]))
    tables += ["", "hvd_mnist against Horovod's example, 320 x 128 images in all, medians of "
               f"{args.versus_repeats} alternating runs; {baseline_sentence(results)}", "",
               versus_example.table(results["versus_example"]), "",
               "Start-up levers, seconds in one process: " + ", ".join(
                   f"{k.replace('_', ' ')} {v:.2f}" for k, v in results["startup_levers"].items())
               + ".", "",
               levers_table(results["step_levers"], results["threads"])]
    markdown_path = args.report.replace(".json", ".md")
    with open(markdown_path, "w") as f:
        f.write("\n".join(tables) + "\n")
    print("\n".join(tables))
    print(f"bench: {results['bench_seconds']:.0f} s; wrote {args.report} and {markdown_path}")


def baseline_sentence(results) -> str:
    if "baseline" not in results:
        return "no baseline report."
    b = results["baseline"]
    return (f"the baseline is {b['report']} of {b['date']} ({b['machine']}): ratios measured "
            "in its one run, set beside today's.")


def startup_levers(data_dir: str, repeats: int = 3) -> dict:
    """Seconds a process spends loading both splits, from the decoded copy (make data) and
    by decoding the TFDS files as before; and importing tensorflow_datasets, which only the
    latter needs (in a fresh process that has imported TensorFlow already)."""
    from hvd_mnist.data import splits
    seconds = {"read_decoded_copy": [], "decode_tfds_files": [], "import_tensorflow_datasets": []}
    for _ in range(repeats):
        for name, load in (("read_decoded_copy", splits.load_split),
                           ("decode_tfds_files", splits.decode_split)):
            start = time.perf_counter()
            for split in ("train", "test"):
                load(data_dir, split)
            seconds[name].append(time.perf_counter() - start)
        timed = subprocess.run([sys.executable, "-c", "import time, tensorflow; t = "
                                "time.perf_counter(); import tensorflow_datasets; "
                                "print(time.perf_counter() - t)"],
                               capture_output=True, text=True, check=True)
        seconds["import_tensorflow_datasets"].append(float(timed.stdout.split()[-1]))
    return {name: statistics.median(values) for name, values in seconds.items()}


def versus(args, nps, results, baseline):
    """Part 5: against Horovod's example, beside the baseline's ratios; the levers."""
    results["startup_levers"] = startup_levers(args.data_dir)
    print("start-up levers (s): " + ", ".join(f"{k} {v:.2f}" for k, v in
                                              results["startup_levers"].items()), flush=True)
    results["versus_example"] = versus_example.compare(
        nps, args.versus_repeats, args.out_dir, args.data_dir, args.idx_dir, baseline)
    print(versus_example.table(results["versus_example"]), flush=True)
    results["step_levers"] = step_levers(2, os.path.join(args.out_dir, "step_levers_np2"),
                                         ["--windows=12"])
    results["threads"] = {f"np{np_}_threads{threads}": step_levers(
        np_, os.path.join(args.out_dir, f"threads_np{np_}_{threads}"),
        ["--windows=10", "--only=hvd_mnist", f"--threads_per_rank={threads}"])
        for np_ in (2, 4) for threads in (1, 2)}


def step_levers(np_, out_prefix, flags):
    rc, _ = launch.job(np_, launch.python_module("tools.bench.step_levers",
                                                 f"--report={out_prefix}.json", *flags),
                       out_prefix + ".log", timeout_seconds=900)
    if rc != 0:
        sys.exit(f"bench: step_levers failed ({rc}); see {out_prefix}.log")
    with open(out_prefix + ".json") as f:
        return json.load(f)


def levers_table(levers, threads) -> str:
    lines = [f"The step's levers at -np {levers['np']} ({levers['threads_per_rank']} thread(s) "
             "per rank), taking turns in one job, synthetic batches:", "",
             "| step | images/s | x hvd_mnist's step | first call s |", "|---|---|---|---|"]
    for name, rate in levers["images_per_second"].items():
        lines.append(f"| {name} | {rate:.0f} | {levers['over_hvd_mnist'][name]:.3f} | "
                     f"{levers['first_call_seconds'][name]:.2f} |")
    lines += ["", "| -np | TF threads per rank | images/s |", "|---|---|---|"]
    for result in threads.values():
        lines.append(f"| {result['np']} | {result['threads_per_rank']} | "
                     f"{result['images_per_second']['hvd_mnist']:.0f} |")
    return "\n".join(lines)


INPUT_RUN_STEPS = 60  # per epoch, 2 epochs: long enough for steady state and a full RSS


def input_modes(args) -> dict:
    """Part 4: every input mode at -np 2, the pipeline alone and in a short training run."""
    from hvd_mnist.data import inputs
    out = {}
    for mode in ("memory", "stream", "files"):
        data_dir = args.sharded_data_dir if mode == "files" else args.data_dir
        pipeline = pipeline_images_per_second(data_dir, 128, size=2, mode=mode)
        run = launch_run(f"input_{mode}_np2", 2, [
            f"--input={mode}", "--epochs=2", f"--max_steps_per_epoch={INPUT_RUN_STEPS}"],
            data_dir, args.out_dir, timeout_seconds=900)
        per_rank_training = run["images_per_second"] / 2
        out[mode] = {
            "data_dir": data_dir,
            "pipeline_images_per_second_per_rank": pipeline,
            "training_images_per_second_per_rank": per_rank_training,
            "pipeline_over_training": pipeline / per_rank_training,
            "peak_rss_mib_per_rank": run["peak_rss_mib_per_rank"],
            "record_bytes_per_rank_per_epoch": inputs.bytes_per_epoch(
                data_dir, mode, inputs.Shard(0, 2)),
        }
        print(f"input {mode}: pipeline {pipeline:.0f} images/s per rank, "
              f"{out[mode]['pipeline_over_training']:.0f}x training", flush=True)
    return out


def input_table(modes: dict) -> str:
    lines = ["", "| --input (-np 2) | pipeline images/s per rank | x training per rank "
             "| peak RSS MiB per rank | record bytes per rank per epoch |",
             "|---|---|---|---|---|"]
    for mode, m in modes.items():
        read = (f"{m['record_bytes_per_rank_per_epoch'] / 2**20:.1f} MiB" if mode != "memory"
                else "0 (the split, read once per run)")
        lines.append(f"| {mode} | {m['pipeline_images_per_second_per_rank']:.0f} | "
                     f"{m['pipeline_over_training']:.0f} | "
                     f"{', '.join(f'{r:.0f}' for r in m['peak_rss_mib_per_rank'])} | {read} |")
    return "\n".join(lines)


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


def table(results, nps):
    lines = ["", "| run | images/s | peak RSS MiB/rank | launch to 1st step s "
             "| last step to exit s | summary to exit s |",
             "|---|---|---|---|---|---|",
             f"| plain TF, 1 process, no Horovod | {results['plain_tf_images_per_second']:.0f} "
             "| | | | |",
             f"| input pipeline alone, per rank | "
             f"{results['pipeline_images_per_second_per_rank']:.0f} | | | | |"]
    for name, run in results["throughput"].items():
        lines.append(f"| {name} | {run['images_per_second']:.0f} | "
                     f"{max(run['peak_rss_mib_per_rank']):.0f} | "
                     f"{run['launch_to_first_step_seconds']:.1f} | "
                     f"{run['last_step_to_exit_seconds']:.1f} | "
                     f"{run['summary_to_exit_seconds']:.1f} |")
    for name, value in results.get("time_to_accuracy", {}).items():
        lines.append(f"| time to 99.0% at -np 2, {name} | {value['training_seconds']} s "
                     f"(epoch {value['epoch']}) | | | | |")
    lines += ["", "ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in results["ratios"].items())]
    if "ratios_over_baseline" in results:
        lines += ["", "each over the baseline's: " + ", ".join(
            f"{k} {v:.2f}" for k, v in results["ratios_over_baseline"].items())]
    return "\n".join(lines)


if __name__ == "__main__":
    define_flags()
    app.run(main)
