"""make bench: hvd_mnist on this machine, side by side with what a user would run instead.

    python -m tools.bench [--parts=paths,accuracy,versus,torch,limit] [--nps=1,2,4]

First each precision's step alone (limit.screen_precisions). Parts, in this order: paths
(float32's step alone, then the custom loop and Keras fit at each --nps) and accuracy
(seconds to 99.0% at -np 2 of each recipe and precision), both in training_paths.py; versus
(against Horovod's own example at each --nps) and torch (with the same job in PyTorch DDP
beside them, in float32 and bfloat16), both in versus.py; limit (each precision against the
machine's peak GFLOP/s, and one step taken apart beside PyTorch's, limit.py). Writes
reports/bench.json and .md; a run of some parts only, reports/bench_<parts>.json and .md
instead.
"""

import os
import shlex
import sys
import time

# The environment as given, for the report's command: importing hvd_mnist sets
# TF_ENABLE_ONEDNN_OPTS for itself (hvd_mnist/worker/cpu_kernels.py), which the user did not.
GIVEN_ENVIRONMENT = dict(os.environ)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tools.bench import launch, limit, machine, tables, training_paths, versus  # noqa: E402

PARTS = ("paths", "accuracy", "versus", "torch", "limit")
REPORT = "reports/bench.json"  # of a run of every part
# Settings that change the arithmetic every run measures (ONEDNN_MAX_CPU_ISA=AVX2 emulates the
# AVX2-only machines): the report's command names those that were set.
ARITHMETIC_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "TF_ENABLE_ONEDNN_OPTS")


def define_flags():
    flags.DEFINE_string("data_dir", "data/tfds", "The prepared mnist (make data).")
    flags.DEFINE_string("idx_dir", "data/cache/idx", "The IDX files make data writes: the "
                        "example's data.")
    flags.DEFINE_string("out_dir", "runs/bench", "Where the runs and their logs go.")
    flags.DEFINE_list("parts", list(PARTS), "The parts to run: " + ", ".join(PARTS) + ".")
    flags.register_validator("parts", lambda v: bool(v) and set(v) <= set(PARTS),
                             message="--parts must name some of " + ", ".join(PARTS))
    flags.DEFINE_list("nps", ["1", "2", "4"], "Numbers of workers of parts paths, versus, "
                      "torch and limit.")
    flags.register_validator("nps", lambda v: bool(v) and all(n.isdigit() and int(n) > 0
                                                              for n in v),
                             message="--nps must be positive integers, e.g. 1,2,4")
    # float32 alone where bfloat16 cannot run: under ONEDNN_MAX_CPU_ISA=AVX2, which emulates
    # the AVX2-only machines, oneDNN has no bfloat16 convolution. (On a CPU without bfloat16
    # instructions the bench leaves it out by itself: limit.screen_precisions.)
    flags.DEFINE_multi_enum("torch_precisions", list(versus.PRECISIONS), versus.PRECISIONS,
                            "Precisions of part torch.")
    flags.DEFINE_integer("versus_repeats", 3, "Alternating runs of each program per -np "
                         "in parts versus and torch.", lower_bound=1)


def command_line(arguments: list, environ) -> str:
    """This run's command as a shell line, after the arithmetic settings it ran under."""
    settings = [f"{name}={environ[name]}" for name in ARITHMETIC_ENV if name in environ]
    return shlex.join([*settings, "python", "-m", "tools.bench", *arguments])


def report_path(report: str, parts: list) -> str:
    """report for a run of every part, reports/bench_<parts>.json for fewer, so that a
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
    training_paths.use_every_core()

    # Part torch runs the PyTorch job, part limit takes PyTorch's step apart: without the
    # PyTorch venv the bench stops here, not after an hour of runs.
    torch_python = launch.torch_python() if {"torch", "limit"} & set(args.parts) else None
    versus_torch = torch_python if "torch" in args.parts else None
    # The command as given: a partial run's report says which parts, -np and repeats it had.
    results = {"machine": machine.description(), "date": machine.now(), "parts": args.parts,
               "command": command_line(sys.argv[1:], GIVEN_ENVIRONMENT)}
    # Each precision's step alone first: one far slower than float32 here (bfloat16 without
    # its instructions, as on the AVX2-only machines) is left out of every part.
    if {"paths", "accuracy", "torch", "limit"} & set(args.parts):
        results["precisions"] = limit.screen_precisions()
    skipped = results.get("precisions", {}).get("skipped", {})
    if "paths" in args.parts:
        training_paths.measure(results, nps, args.data_dir, args.out_dir)
    if "accuracy" in args.parts:
        results["time_to_accuracy"] = training_paths.time_to_accuracy(
            args.data_dir, args.out_dir, skipped)
    if "versus" in args.parts or "torch" in args.parts:
        precisions = ([p for p in args.torch_precisions if p not in skipped] if versus_torch
                      else ["float32"])
        results["versus"] = {"repeats": args.versus_repeats, "comparison": versus.compare(
            nps, precisions, args.versus_repeats, args.out_dir, args.data_dir, args.idx_dir,
            versus_torch)}
        if versus_torch:
            results["versus"]["versions"] = versus.versions(versus_torch)
        print(versus.table(results["versus"]["comparison"]), flush=True)
    if "limit" in args.parts:
        results["limit"] = limit.measure(results, nps, args.data_dir, args.out_dir, torch_python)
    results["bench_seconds"] = time.perf_counter() - started
    write_reports(report_path(REPORT, args.parts), results)


def write_reports(path: str, results: dict) -> None:
    """The JSON report at path, and beside it (.md) every table of this run."""
    sections = [f"`{results.get('command', 'make bench')}` on {results['machine']}, "
                f"{results['date']} ({results['bench_seconds']:.0f} s).", ""]
    screened = results.get("precisions", {})
    for precision, reason in screened.get("skipped", {}).items():
        sections += [f"{precision} is left out of every part ({reason}).", ""]
    if "throughput" in results:
        sections += [training_paths.table(results), ""]
    if "time_to_accuracy" in results:
        png = os.path.splitext(path)[0] + "_time_to_accuracy.png"
        training_paths.plot_time_to_accuracy(results["time_to_accuracy"], png)
        sections += [training_paths.accuracy_table(results["time_to_accuracy"]), "",
                     f"The curves: {png}.", ""]
    if "versus" in results:
        sections += [*versus.section(results["versus"]), ""]
    if "limit" in results:
        sections += [limit.table(results["limit"]), ""]
    markdown_path = tables.write(path, results, "\n".join(sections))
    print(f"bench: {results['bench_seconds']:.0f} s; wrote {path} and {markdown_path}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
