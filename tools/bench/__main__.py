"""make bench: the training paths side by side on this machine, in one run.

    python -m tools.bench [--parts=paths,accuracy,inputs,versus,torch,limit]

(~45 min on 2 cores without part torch, which no quiet run has timed yet).

Parts, in this order:
  paths     1. the model's step in plain TF in this process, no Horovod (the machine's
               practical limit), and the input pipeline alone (in_process.py);
            2. the custom loop and Keras fit at each --nps: images/s over all ranks
               (steady_state.py), peak resident memory per rank, launch to the first
               finished step, last step to exit (training_paths.py);
  accuracy  3. time to 99.0% test accuracy at -np 2: the seed recipe on both paths and
               --recipe=fast on the custom loop (training seconds, evaluation excluded);
  inputs    4. each --input mode at -np 2: the pipeline alone, bytes read, a short run
               (input_modes.py);
  versus    5. hvd_mnist against Horovod's own example at each --nps (versus_example.py),
               then the step's and start-up levers (levers.py);
  torch    5b. hvd_mnist against the same job in PyTorch DDP under torchrun, and Horovod's
               example, taking turns at each --nps, in float32 and bfloat16, in the PyTorch
               venv the bench makes when it is missing (versus_torch.py, torch_venv.py);
  limit     6. each --precision against the machine's measured peak: FLOPs per training
               image, matmul and convolution peaks, where one step's time goes layer by
               layer, achieved GFLOP/s at each --nps, and time to 99.0% per precision and
               recipe, with its curves as a PNG beside the report (limit.py); the
               float32 runs of part 3, when it ran, are taken, not run again.
Ratios measured in this run are set beside the baseline report's (baselines.py).
Writes reports/bench.json and reports/bench.md (docs/performance.md summarises them); a run
of some parts only writes reports/bench_<parts>.json and .md instead.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tools.bench import (baselines, in_process, input_modes, levers, limit,  # noqa: E402
                         machine, torch_venv, training_paths, versus_example, versus_torch)

PARTS = ("paths", "accuracy", "inputs", "versus", "torch", "limit")


def define_flags():
    flags.DEFINE_string("data_dir", "data/tfds", "The prepared mnist (make data).")
    flags.DEFINE_string("sharded_data_dir", "data/tfds-sharded", "The same dataset in 8 "
                        "files per split, for --input=files (make data-sharded).")
    flags.DEFINE_string("idx_dir", "data/cache/idx", "The IDX files make data writes: the "
                        "example's data.")
    flags.DEFINE_string("out_dir", "runs/bench", "Where the runs and their logs go.")
    flags.DEFINE_string("report", "reports/bench.json", "The JSON report of a run of every "
                        "part; the Markdown tables go beside it (.md).")
    flags.DEFINE_string("baseline_report", "reports/bench.json", "An earlier make bench "
                        "report whose ratios this run's are set beside (read before this "
                        "run writes its own; a missing file: no baseline).")
    flags.DEFINE_list("parts", list(PARTS), "The parts to run: " + ", ".join(PARTS) + ".")
    flags.register_validator("parts", lambda v: bool(v) and set(v) <= set(PARTS),
                             message="--parts must name some of " + ", ".join(PARTS))
    flags.DEFINE_list("nps", ["1", "2", "4"], "Numbers of workers of parts 2 and 5.")
    flags.register_validator("nps", lambda v: bool(v) and all(n.isdigit() and int(n) > 0
                                                              for n in v),
                             message="--nps must be positive integers, e.g. 1,2,4")
    flags.DEFINE_integer("throughput_steps", training_paths.THROUGHPUT_STEPS,
                         "Steps of each part 2 run.", lower_bound=40)
    flags.DEFINE_bool("limit_accuracy", True, "Part 6 also trains each precision to 99.0% "
                      "at -np 2 (about 20 min on 2 cores).")
    flags.DEFINE_integer("versus_repeats", 3, "Alternating runs of each program per -np "
                         "in part 5 and in part torch.", lower_bound=1)
    flags.DEFINE_string("torch_venv", torch_venv.DEFAULT_VENV, "The PyTorch venv of part "
                        "torch, made (tools/pins/torch.txt) when missing.")
    flags.DEFINE_list("torch_precisions", list(versus_torch.PRECISIONS), "Precisions of part "
                      "torch: " + ", ".join(versus_torch.PRECISIONS) + ".")
    flags.register_validator("torch_precisions",
                             lambda v: bool(v) and set(v) <= set(versus_torch.PRECISIONS),
                             message="--torch_precisions must name some of "
                             + ", ".join(versus_torch.PRECISIONS))


def report_path(report: str, parts: list) -> str:
    """--report for a run of every part, reports/bench_<parts>.json for fewer, so that a
    partial run never replaces the full report."""
    if set(parts) == set(PARTS):
        return report
    stem, extension = os.path.splitext(report)
    return f"{stem}_{'_'.join(p for p in PARTS if p in parts)}{extension}"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    args = flags.FLAGS
    nps = [int(n) for n in args.nps]
    started = time.perf_counter()
    in_process.use_every_core()

    # The PyTorch venv first: a machine that cannot make it stops the bench before an hour of runs.
    torch_python = (torch_venv.ensure(os.path.abspath(args.torch_venv))
                    if "torch" in args.parts else None)
    results = {"machine": machine.description(), "date": machine.now(), "parts": args.parts}
    baseline = baselines.load(args.baseline_report)  # before this run writes its own
    if baseline:
        results["baseline"] = baselines.provenance(baseline, args.baseline_report)
    if "inputs" in args.parts:
        results["input_modes"] = input_modes.measure(args.data_dir, args.sharded_data_dir,
                                                     args.out_dir)
    if "paths" in args.parts:
        training_paths.measure(results, nps, args.throughput_steps, args.data_dir,
                               args.out_dir)
        if baseline and "ratios" in baseline:
            results["ratios_over_baseline"] = baselines.changes(results["ratios"],
                                                                baseline["ratios"])
    if "accuracy" in args.parts:
        results["time_to_accuracy"] = training_paths.time_to_accuracy(args.data_dir,
                                                                      args.out_dir)
    if "versus" in args.parts:
        results["versus_example"] = versus_example.compare(
            nps, args.versus_repeats, args.out_dir, args.data_dir, args.idx_dir, baseline)
        print(versus_example.table(results["versus_example"]), flush=True)
        levers.measure(results, args.data_dir, args.out_dir)
    if "torch" in args.parts:
        results["versus_torch"] = {
            "versions": torch_venv.versions(torch_python), "repeats": args.versus_repeats,
            "comparison": versus_torch.compare(
                nps, args.torch_precisions, args.versus_repeats, args.out_dir, args.data_dir,
                args.idx_dir, torch_python, baseline)}
        print(versus_torch.table(results["versus_torch"]["comparison"]), flush=True)
    if "limit" in args.parts:
        results["limit"] = limit.measure(nps, args.throughput_steps, args.data_dir,
                                         args.idx_dir, args.out_dir, args.limit_accuracy,
                                         results.get("time_to_accuracy"))
    results["bench_seconds"] = time.perf_counter() - started
    write_reports(report_path(args.report, args.parts), results, args.versus_repeats)


def write_reports(path: str, results: dict, versus_repeats: int) -> None:
    """The JSON report at path, and beside it (.md) every table of this run."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    sections = [f"`make bench` on {results['machine']}, {results['date']} "
              f"({results['bench_seconds']:.0f} s).", ""]
    if "throughput" in results:
        sections += [training_paths.table(results), ""]
    if "time_to_accuracy" in results:
        sections += [training_paths.accuracy_table(results["time_to_accuracy"]), ""]
    if "input_modes" in results:
        sections += [input_modes.table(results["input_modes"]), ""]
    if "versus_example" in results:
        sections += ["hvd_mnist against Horovod's example, 320 x 128 images in all, medians of "
                   f"{versus_repeats} alternating runs; {baseline_sentence(results)}", "",
                   versus_example.table(results["versus_example"]), "",
                   levers.startup_sentence(results["startup_levers"]), "",
                   levers.table(results["step_levers"], results["threads"]), ""]
    if "versus_torch" in results:
        sections += [*versus_torch.section(results["versus_torch"]), ""]
    if "limit" in results:
        sections += [limit.table(results["limit"]), ""]
        if "time_to_accuracy" in results["limit"]:
            png = os.path.splitext(path)[0] + "_time_to_accuracy.png"
            limit.plot_time_to_accuracy(results["limit"]["time_to_accuracy"], png)
            sections += [f"The curves: {png}.", ""]
    markdown_path = os.path.splitext(path)[0] + ".md"
    with open(markdown_path, "w") as f:
        f.write("\n".join(sections))
    print("\n".join(sections))
    print(f"bench: {results['bench_seconds']:.0f} s; wrote {path} and {markdown_path}")


def baseline_sentence(results) -> str:
    if "baseline" not in results:
        return "no baseline report."
    b = results["baseline"]
    return (f"the baseline is {b['report']} of {b['date']} ({b['machine']}): ratios measured "
            "in its one run, set beside today's.")


if __name__ == "__main__":
    define_flags()
    app.run(main)
