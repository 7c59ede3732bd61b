"""Parts "versus" and "torch" of make bench: hvd_mnist against Horovod's own TF2 MNIST example
(horovod_example.py) and, with part "torch", the same job in PyTorch DDP under torchrun
(torch_ddp.py), side by side: STEPS steps of BATCH_SIZE images per worker (fewer where one epoch
holds fewer, steps_for), Adam 0.001 x
workers (DIFFERENCES says what else is the same and what differs). Each precision at each
-np: one warm-up round first (discarded: page cache, .pyc files), then `repeats` rounds, the
programs taking turns; each figure's median, and hvd_mnist's over the others'.
"""

import json
import os
import pathlib
import resource
import subprocess
import time

import numpy as np

from tools.bench import launch, steady_state, tables

STEPS = 160
BATCH_SIZE = 128
TIMEOUT_SECONDS = 600
PRECISIONS = ("float32", "mixed_bfloat16")
RESULT_PREFIX = "torch_ddp result: "  # torch_ddp.RESULT_PREFIX (that module imports torch)


def steps_for(np_: int) -> int:
    """STEPS per worker, or as many as one epoch holds at this -np (117 at -np 4), for
    every program alike."""
    return min(STEPS, launch.steps_in_epoch(np_, BATCH_SIZE))


DIFFERENCES = """\
What is the same in both jobs: the model's shapes and 1,199,882 weights, initialised as Keras \
does (glorot_uniform, zero biases); Adam at 0.001 x workers with Keras's epsilon (1e-7); 128 \
images per worker per step, 160 steps (117 at -np 4); the same decoded copy of MNIST, in the \
same order on each rank; as many threads per \
process as hvd_mnist's default (cores / workers on the host); the gradients' average over \
the ranks (4.8 MB of float32) every step over Gloo; each rank evaluating its share of the \
10,000 test images and the sums meeting; rank 0's checkpoint at the end. What differs: \
hvd_mnist also averages each step's loss over the ranks and checks it is finite on every \
rank, checks the copy against make data's sha256s in every run (for PyTorch the bench \
checks it once, when it writes the arrays the PyTorch job loads), prefetches batches on a \
tf.data thread, broadcasts the optimizer's state with the \
weights before step 1, and writes config.json, summary.json, TensorBoard events and a lock \
on its model_dir; PyTorch reads the loss locally, gathers each batch on the training thread \
and writes the checkpoint and summary.json. The loss is Keras's cross-entropy of the \
softmax's probabilities against PyTorch's of the logits; the images are channels-last \
against channels-first; dropout masks come from each framework's own generator. hvd_mnist \
asks TensorFlow for its oneDNN kernels (hvd_mnist/worker/cpu_kernels.py), which TensorFlow \
turns on by itself only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, and Horovod's \
example inherits that setting from the bench's environment, so both TensorFlow programs run \
the same kernels; PyTorch runs oneDNN's convolutions on any x86-64 CPU. In \
mixed_bfloat16 Keras computes every layer but the softmax in bfloat16 with float32 weights; \
torch.autocast casts the convolutions' and dense layers' inputs and weights to bfloat16 and \
runs the rest in float32. Why that is fair: both do the same arithmetic and move the same \
bytes per step on the same cores and threads, each started as its users start it; what \
hvd_mnist does beyond PyTorch's job is counted in its own times, against it, and steady \
images/s, which leaves out start-up and the end, compares the steps alone."""


def torchrun_command(np_: int, torch_python: str, *args,
                     module: str = "tools.bench.torch_ddp") -> list:
    """`torchrun --standalone --nproc_per_node=N -m module args...` with the PyTorch venv's
    torchrun, whose workers run that venv's python."""
    return [os.path.join(os.path.dirname(torch_python), "torchrun"), "--standalone",
            f"--nproc_per_node={np_}", "-m", module, *args]


def parse_result(output: str) -> dict:
    """The summary rank 0 of torch_ddp.py prints as one line; SystemExit without one."""
    return launch.last_json_line(output, RESULT_PREFIX)


def figures(summary: dict, launch_unix: float, wall_seconds: float) -> dict:
    """The row of one PyTorch run from its summary: what run_hvd_mnist reads of hvd_mnist's."""
    return {"wall_seconds": wall_seconds, "peak_rss_mib": max(summary["peak_rss_mib_per_rank"]),
            "last_step_to_exit_seconds": (launch_unix + wall_seconds
                                          - summary["timing"]["last_step_unix_time"]),
            **{key: summary[key] for key in ("images_per_second", "launch_to_first_step_seconds",
                                             "test_accuracy")}}


def run_example(np_, out_dir, idx_dir):
    """One run of Horovod's example, its files in out_dir/example_np<N>."""
    run_dir = os.path.abspath(os.path.join(out_dir, f"example_np{np_}"))
    launch_unix = time.time()
    rc, seconds = launch.job(np_, launch.python_module(
        "tools.bench.horovod_example", f"--idx_dir={os.path.abspath(idx_dir)}",
        f"--steps={steps_for(np_)}", f"--out_dir={run_dir}"), run_dir + ".log", TIMEOUT_SECONDS)
    if rc != 0:
        raise SystemExit(f"versus: the example failed ({rc}); see {run_dir}.log")
    ranks = [json.loads(pathlib.Path(run_dir, f"rank{rank}.json").read_text())
             for rank in range(np_)]
    times = ranks[0]["step_unix_times"]
    return {"wall_seconds": seconds,
            "images_per_second": steady_state.images_per_second(
                steady_state.windows_from_step_times(times, BATCH_SIZE * np_)),
            "launch_to_first_step_seconds": times[0] - launch_unix,
            "last_step_to_exit_seconds": launch_unix + seconds - times[-1],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in ranks),
            "end_wait_seconds": max(r["loop_end_unix_time"] - r["step_unix_times"][-1]
                                    for r in ranks)}


def write_arrays(data_dir: str, out_dir: str) -> str:
    """Both splits of make data's decoded copy, as hvd_mnist's loader reads and checks them,
    written as .npy files into out_dir/mnist_arrays for the PyTorch job, whose venv has no
    TensorFlow to read the copy with (torch_ddp.load_split); that directory."""
    from hvd_mnist.data import splits
    arrays_dir = os.path.abspath(os.path.join(out_dir, "mnist_arrays"))
    os.makedirs(arrays_dir, exist_ok=True)
    for split in splits.SPLITS:
        loaded = splits.load_split(data_dir, split)
        np.save(os.path.join(arrays_dir, f"{split}-images.npy"), loaded.images)
        np.save(os.path.join(arrays_dir, f"{split}-labels.npy"), loaded.labels)
    return arrays_dir


def versions(torch_python: str) -> dict:
    """Python's, PyTorch's and numpy's versions in the PyTorch venv."""
    out = subprocess.run([torch_python, "-c", "import sys, numpy, torch; print("
                          "sys.version.split()[0], torch.__version__, numpy.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(("python", "torch", "numpy"), out))


def run_torch(np_, precision, out_dir, arrays_dir, torch_python):
    name = f"torch_{precision}_np{np_}"
    run_dir = os.path.abspath(os.path.join(out_dir, name))
    launch_unix = time.time()
    command = torchrun_command(np_, torch_python, f"--arrays_dir={arrays_dir}",
                               f"--out_dir={run_dir}", f"--steps={steps_for(np_)}",
                               f"--batch_size={BATCH_SIZE}", f"--precision={precision}",
                               f"--launch_unix_time={launch_unix}")
    log_path = run_dir + ".log"
    rc, seconds = launch.run_logged(command, log_path, TIMEOUT_SECONDS)
    if rc != 0:
        raise SystemExit(f"versus: the PyTorch job failed ({rc}); see {log_path}")
    with open(log_path) as log:
        return figures(parse_result(log.read()), launch_unix, seconds)


def run_hvd_mnist(np_, precision, out_dir, data_dir):
    run = launch.train(f"hvd_mnist_{precision}_np{np_}", np_, [
        "--optimizer=adam", "--learning_rate=0.001", f"--batch_size={BATCH_SIZE}", "--epochs=1",
        f"--max_steps_per_epoch={steps_for(np_)}", "--noexport", f"--precision={precision}"],
        data_dir, out_dir, TIMEOUT_SECONDS)
    return {**{key: run[key] for key in KEYS if key in run},  # all but cpu_seconds
            "test_accuracy": run["summary"]["test_accuracy"]}


def with_cpu_seconds(run) -> dict:
    """run()'s figures and the CPU seconds (user + system) of the processes it started,
    as far as they were reaped: the bench runs one job at a time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures_ = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {**figures_, "cpu_seconds": (after.ru_utime - before.ru_utime)
            + (after.ru_stime - before.ru_stime)}


def programs(np_, precision, out_dir, data_dir, idx_dir, torch_python, arrays_dir) -> dict:
    """The runs of one round, in the order they take turns."""
    out = {}
    if precision == "float32":
        out["example"] = lambda: run_example(np_, out_dir, idx_dir)
    out["hvd_mnist"] = lambda: run_hvd_mnist(np_, precision, out_dir, data_dir)
    if torch_python:
        out["torch"] = lambda: run_torch(np_, precision, out_dir, arrays_dir, torch_python)
    return out


def compare(nps, precisions, repeats, out_dir, data_dir, idx_dir, torch_python=None) -> dict:
    """{"<precision>_np<N>": every run's figures, their medians, and hvd_mnist's over the
    example's and (with torch_python, the PyTorch venv's) PyTorch's}."""
    arrays_dir = write_arrays(data_dir, out_dir) if torch_python else None
    for who, run in programs(nps[0], precisions[0], out_dir, data_dir, idx_dir,
                             torch_python, arrays_dir).items():
        print(f"warm-up: {who} {run()['wall_seconds']:.1f} s", flush=True)
    out = {}
    for precision in precisions:
        for np_ in nps:
            runs = {}
            for _ in range(repeats):
                for who, run in programs(np_, precision, out_dir, data_dir, idx_dir,
                                         torch_python, arrays_dir).items():
                    runs.setdefault(who, []).append(with_cpu_seconds(run))
                print(f"{precision} np {np_}: " + ", ".join(
                    f"{who} {rs[-1]['wall_seconds']:.1f} s" for who, rs in runs.items()),
                    flush=True)
            medians = {who: steady_state.median_of_runs(rs) for who, rs in runs.items()}
            key = f"{precision}_np{np_}"
            result = out[key] = {"np": np_, "precision": precision, "runs": runs,
                                 "median": medians}
            for other in ("torch", "example"):
                if other in medians:
                    result[f"hvd_mnist_over_{other}"] = steady_state.ratios(
                        medians["hvd_mnist"], medians[other])
    return out


LABELS = {("float32", "example"): "Horovod's example",
          ("float32", "hvd_mnist"): "hvd_mnist",
          ("float32", "torch"): "PyTorch DDP",
          ("mixed_bfloat16", "hvd_mnist"): "hvd_mnist, --precision=mixed_bfloat16",
          ("mixed_bfloat16", "torch"): "PyTorch DDP, torch.autocast(bfloat16)"}
RATIOS = (("hvd_mnist_over_torch", "hvd_mnist / PyTorch"),
          ("hvd_mnist_over_example", "hvd_mnist / example"))
KEYS = ("wall_seconds", "cpu_seconds", "images_per_second", "launch_to_first_step_seconds",
        "last_step_to_exit_seconds", "peak_rss_mib")


def table(comparison: dict) -> str:
    rows = []
    for result in comparison.values():
        np_, precision = result["np"], result["precision"]
        for who, median in result["median"].items():
            accuracy = median.get("test_accuracy")
            rows.append([np_, LABELS[precision, who], *(tables.figure(median.get(k)) for k in KEYS),
                         "–" if accuracy is None else f"{100 * accuracy:.2f}%"])
        for key, label in RATIOS:
            if key in result:
                rows.append([np_, f"**{label}**",
                             *(tables.ratio(result[key].get(k)) for k in KEYS), ""])
    return tables.markdown(["-np", "run", "whole process s", "CPU s", "steady images/s",
                            "launch to 1st step s", "last step to exit s", "peak RSS MiB/rank",
                            "test accuracy"], rows)


# hvd_mnist's whole-process wall over Horovod's example's, at most, from -np 2 up.
EXAMPLE_WALL_TARGET = 0.8
# Issue 41's targets: (ratios, figure, what it is, wanted, of whom, bound, from which -np).
TARGETS = (("hvd_mnist_over_torch", "images_per_second", "steady images/s", "at least",
            "PyTorch's", 1.0, 1),
           ("hvd_mnist_over_torch", "wall_seconds", "whole-process wall", "at most",
            "PyTorch's", 1.0, 1),
           ("hvd_mnist_over_example", "wall_seconds", "whole-process wall", "at most",
            f"{EXAMPLE_WALL_TARGET}x Horovod's example's", EXAMPLE_WALL_TARGET, 2))


def targets(comparison: dict) -> list:
    """Issue 41's targets, each met or missed with its figure (TARGETS)."""
    lines = []
    for result in comparison.values():
        for ratios, figure, what, want, of_whom, bound, from_np in TARGETS:
            value = result.get(ratios, {}).get(figure)
            if value is None or result["np"] < from_np:
                continue
            met = value >= bound if want == "at least" else value <= bound
            lines.append(f"{result['precision']}, -np {result['np']}: hvd_mnist's {what} "
                         f"{want} {of_whom}: {'met' if met else 'missed'} "
                         f"({tables.ratio(value)})")
    return lines


def example_waits(comparison: dict):
    """The line that gives, at each -np and round, how long the example's slowest rank took
    from its last step to its loop's end; None for runs that did not record it."""
    waits = []
    for result in comparison.values():
        runs = result.get("runs", {}).get("example", [])
        if runs and all("end_wait_seconds" in run for run in runs):
            waits.append(f"-np {result['np']}: "
                         + ", ".join(f"{run['end_wait_seconds']:.1f}" for run in runs))
    if not waits:
        return None
    return ("Horovod's example, seconds from its last step to the end of its loop, where its "
            "dataset's iterator is deleted (the slowest rank, each round): " + "; ".join(waits)
            + ". Tens of seconds there are tf.data's autotuner, which hvd_mnist turns off "
            "(reports/example_autotune_wait_xeon_amx.md).")


def section(report: dict) -> list:
    """The Markdown lines of this part: what ran, the table, the example's waits at its end,
    and with PyTorch the targets and what differs between the jobs."""
    v = report.get("versions")
    against = (f"PyTorch DDP (PyTorch {v['torch']}, Python {v['python']}, torchrun, Gloo) and "
               if v else "")
    lines = [f"hvd_mnist against {against}Horovod's example: {STEPS} steps of {BATCH_SIZE} "
             f"images per worker (at -np 4, {steps_for(4)}: one epoch), medians of "
             f"{report['repeats']} alternating runs after a warm-up round. A whole process is "
             "its launch to rank 0's first step, the steps, and rank 0's last step to the "
             "job's exit, which for hvd_mnist and PyTorch holds their evaluation of the test "
             "split and for all three rank 0's checkpoint.", "", table(report["comparison"])]
    waits = example_waits(report["comparison"])
    if waits:
        lines += ["", waits]
    if v:
        lines += ["", *(f"- {line}" for line in targets(report["comparison"])), "", DIFFERENCES]
    return lines
