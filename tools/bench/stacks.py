"""make bench-stacks: hvd_mnist's custom loop on the default stack beside the old one, in
one run on one machine.

    python -m tools.bench.stacks [--nps=1,2,4] [--repeats=3]    (~10 min on 2 cores)

The new default is TF 2.21 + Keras 3 + Python 3.12 (--new_venv=.venv), the old stack
TF 2.15 + Keras 2 + Python 3.11 (--old_venv=.venv-tf2.15, make setup TF=2.15). Each run
is one venv's own bin/horovodrun starting its own bin/python -m hvd_mnist.main from this
checkout (that bin/ first on PATH too), the custom loop as make bench's part 2 runs it:
140 steps of 128 images per worker. For each -np the stacks take turns, new first,
--repeats times (ABAB...), so a change in the machine's load hits both alike; each
figure is a stack's median over its runs:

  images_per_second             steady state over all workers (steady_state.py), with
                                the lowest and highest run: the noise a ratio is read in
  launch_to_first_step_seconds  horovodrun's launch to rank 0's first finished step
                                (imports, data, hvd.init, tracing)
  peak_rss_mib_per_rank         each rank's peak resident memory

and new / old of each. The new default must not be slower: new / old images/s at least
1.0 at every -np. Before the runs, each venv reports its versions from a process that
imports its TensorFlow and Horovod, so neither stack's first run pays for a cold page
cache. Writes reports/bench_stacks.json and .md, naming the CPU (model and vector unit)
and both stacks' versions. Absolute figures are this machine's and this load's: compare
the ratios, which were measured side by side.
"""

import json
import os
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tools.bench import (launch, machine, steady_state, tables, training_paths,  # noqa: E402
                         training_run)

FLAGS = flags.FLAGS
STACKS = ("new", "old")
# What a venv reports about itself; hvd_mnist's keras_compat says which Keras tf.keras is.
VERSIONS_PROGRAM = """
import importlib.metadata, json, platform
from hvd_mnist.process import keras_compat
import tensorflow as tf
import horovod.tensorflow
print(json.dumps({"python": platform.python_version(), "tensorflow": tf.__version__,
                  "keras": keras_compat.keras_version(),
                  "horovod": importlib.metadata.version("horovod"),
                  "numpy": importlib.metadata.version("numpy")}))
"""


def define_flags():
    flags.DEFINE_string("new_venv", ".venv", "The default stack's venv.")
    flags.DEFINE_string("old_venv", ".venv-tf2.15", "The stack it is set beside.")
    flags.DEFINE_string("data_dir", "data/tfds", "The prepared mnist (make data).")
    flags.DEFINE_string("out_dir", "runs/bench_stacks", "Where the runs and their logs go.")
    flags.DEFINE_string("report", "reports/bench_stacks.json", "The JSON report; the "
                        "Markdown tables go beside it (.md).")
    flags.DEFINE_list("nps", ["1", "2", "4"], "Numbers of workers.")
    flags.register_validator("nps", lambda v: bool(v) and all(n.isdigit() and int(n) > 0
                                                              for n in v),
                             message="--nps must be positive integers, e.g. 1,2,4")
    flags.DEFINE_integer("repeats", 3, "Runs of each stack per -np, taking turns.",
                         lower_bound=1)
    flags.DEFINE_integer("steps", training_paths.THROUGHPUT_STEPS, "Steps of each run.",
                         lower_bound=40)


def stack(name: str, venv: str) -> dict:
    """A venv's python, bin/ and environment; exits with one line if it is not set up."""
    venv = os.path.abspath(venv)
    bin_dir = os.path.join(venv, "bin")
    for program in ("python", "horovodrun"):
        if not os.path.exists(os.path.join(bin_dir, program)):
            raise SystemExit(f"stacks: error: no {os.path.join(bin_dir, program)} for the "
                             f"{name} stack (make setup, or make setup TF=2.15)")
    return {"name": name, "venv": venv, "bin_dir": bin_dir,
            "python": os.path.join(bin_dir, "python"),
            "env": {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                    "VIRTUAL_ENV": venv}}


def versions(stack_: dict) -> dict:
    result = subprocess.run([stack_["python"], "-c", VERSIONS_PROGRAM], capture_output=True,
                            text=True, timeout=300, cwd=launch.REPO_ROOT,
                            env=launch.environment(stack_["env"]))
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"stacks: error: the {stack_['name']} stack ({stack_['venv']}) "
                         f"cannot report its versions: {last}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_once(stack_: dict, np_: int, repeat: int, steps: int, data_dir: str,
             out_dir: str) -> dict:
    run = training_run.measure(
        f"{stack_['name']}_np{np_}_{repeat}", np_,
        ["--mode=custom", *training_paths.throughput_flags(np_, steps), *training_paths.QUIET],
        data_dir, out_dir, timeout_seconds=900, python=stack_["python"],
        bin_dir=stack_["bin_dir"], env=stack_["env"])
    figures = ("images_per_second", "launch_to_first_step_seconds", "peak_rss_mib_per_rank",
               "wall_seconds", "command")
    return {**{key: run[key] for key in figures},
            "test_accuracy": run["summary"]["test_accuracy"]}


def summarize(runs: list) -> dict:
    """A stack's medians over its runs at one -np, the spread of images/s, and the largest
    rank's peak RSS (the figure new / old compares)."""
    medians = steady_state.median_of_runs(runs)
    rates = [run["images_per_second"] for run in runs]
    return {**medians, "images_per_second_lowest": min(rates),
            "images_per_second_highest": max(rates),
            "peak_rss_mib": max(medians["peak_rss_mib_per_rank"])}


def compare(stacks_: dict, nps: list, repeats: int, steps: int, data_dir: str,
            out_dir: str) -> dict:
    """Per -np: every run of each stack, taking turns, their summaries and new / old."""
    out = {}
    for np_ in nps:
        runs = {name: [] for name in stacks_}
        for repeat in range(1, repeats + 1):
            for name, stack_ in stacks_.items():
                runs[name].append(run_once(stack_, np_, repeat, steps, data_dir, out_dir))
            print(f"stacks: -np {np_}, run {repeat}: " + ", ".join(
                f"{name} {tables.figure(rs[-1]['images_per_second'])} images/s"
                for name, rs in runs.items()), flush=True)
        summaries = {name: summarize(rs) for name, rs in runs.items()}
        out[f"np{np_}"] = {"np": np_, "runs": runs, "median": summaries,
                           "new_over_old": steady_state.ratios(summaries["new"],
                                                               summaries["old"])}
    return out


def not_slower(comparison: dict) -> dict:
    """{"np1": True, ...}: new / old images/s at least 1.0."""
    return {key: result["new_over_old"]["images_per_second"] >= 1.0
            for key, result in comparison.items()}


def stack_label(name: str, versions_: dict) -> str:
    return (f"{name}: TF {versions_['tensorflow']}, Keras {versions_['keras']}, "
            f"Python {versions_['python']}")


def markdown(report: dict) -> str:
    f = tables.figure
    rows = []
    for result in report["comparison"].values():
        for name, s in result["median"].items():
            rows.append([result["np"], stack_label(name, report["versions"][name]),
                         f"{f(s['images_per_second'])} ({f(s['images_per_second_lowest'])}"
                         f"–{f(s['images_per_second_highest'])})",
                         f(s["launch_to_first_step_seconds"]),
                         ", ".join(f(r) for r in s["peak_rss_mib_per_rank"]),
                         f(s["wall_seconds"]), f"{100 * s['test_accuracy']:.2f}%"])
        ratio = result["new_over_old"]
        rows.append([result["np"], "**new / old**", tables.ratio(ratio["images_per_second"]),
                     tables.ratio(ratio["launch_to_first_step_seconds"]),
                     tables.ratio(ratio["peak_rss_mib"]) + " (largest rank)",
                     tables.ratio(ratio["wall_seconds"]), ""])
    verdict = report["not_slower"]
    slower = [key[2:] for key, met in verdict.items() if not met]
    versions_rows = [[name, v["python"], v["tensorflow"], v["keras"], v["horovod"], v["numpy"],
                      f"`{report['venvs'][name]}`"] for name, v in report["versions"].items()]
    return "\n".join([
        "# The default stack beside the old one (make bench-stacks)", "",
        f"{report['date']}, {report['machine']}; {report['wall_seconds']:.0f} s in all. hvd_mnist's custom loop, {report['steps']} "
        f"steps of 128 images per worker a run, {report['repeats']} runs of each stack per "
        "-np, taking turns (new first); medians, images/s with the lowest and highest run.",
        "", tables.markdown(["stack", "Python", "TensorFlow", "Keras", "Horovod", "numpy",
                             "venv"], versions_rows), "",
        tables.markdown(["-np", "stack", "steady images/s (lowest–highest)",
                         "launch to 1st step s", "peak RSS MiB per rank", "whole process s",
                         "test accuracy"], rows), "",
        "The new default must not be slower (new / old images/s at least 1.0 at every -np): "
        + ("**met**." if not slower else f"**not met** at -np {', '.join(slower)}."), ""])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    started = time.perf_counter()
    stacks_ = {"new": stack("new", FLAGS.new_venv), "old": stack("old", FLAGS.old_venv)}
    versions_ = {name: versions(s) for name, s in stacks_.items()}
    for name in STACKS:
        print(f"stacks: {stack_label(name, versions_[name])} ({stacks_[name]['venv']})",
              flush=True)
    comparison = compare(stacks_, [int(n) for n in FLAGS.nps], FLAGS.repeats, FLAGS.steps,
                         FLAGS.data_dir, FLAGS.out_dir)
    report = {"date": machine.now(), "cpu": machine.cpu(),
              "machine": machine.description(with_python=False),
              "venvs": {name: s["venv"] for name, s in stacks_.items()},
              "versions": versions_, "steps": FLAGS.steps, "repeats": FLAGS.repeats,
              "comparison": comparison, "not_slower": not_slower(comparison),
              "wall_seconds": time.perf_counter() - started}
    os.makedirs(os.path.dirname(FLAGS.report) or ".", exist_ok=True)
    with open(FLAGS.report, "w") as f:
        json.dump(report, f, indent=2)
    markdown_path = os.path.splitext(FLAGS.report)[0] + ".md"
    with open(markdown_path, "w") as f:
        f.write(markdown(report))
    print(markdown(report))
    print(f"stacks: wrote {FLAGS.report} and {markdown_path}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
