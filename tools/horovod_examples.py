"""Horovod's own TF2 MNIST examples (tag v0.28.1) at -np 2 against the venv's Horovod, before
and after this project's patches; writes reports/horovod_examples.md (make horovod-examples).

The examples are read from HOROVOD_SRC (an unpacked source tree of the tag, outside this
repository) and edited in a scratch copy: their data-loading line reads MNIST from the IDX
files `make data` wrote instead of downloading it, and every other edit is listed in
EXAMPLES with its reason. An edit that no longer matches its example fails the run. The
"before" and "after" Horovods are tools/horovod_suite.py's overlays: the installed package
with the Python patches reversed or applied, first on PYTHONPATH.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hvd_mnist.verification import launch  # noqa: E402
from tools import horovod_suite  # noqa: E402

ROOT = horovod_suite.ROOT
RUN_TIMEOUT_SECONDS = 900


class Edit(NamedTuple):
    old: str  # must occur exactly once in the example
    new: str
    why: str


# The examples' one data line, as all three spell it. The replacement returns what
# load_data() returns, from the IDX files (tools/bench/horovod_example.py reads them).
DATA_LINE = "tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())"
DATA_CALL = "__import__('tools.bench.horovod_example').bench.horovod_example.load_data({idx!r})"

# Appended to each example's main(): not part of its training, it shows whether the ranks
# ended with the same weights, which a run that trains on unaveraged gradients does not.
MAIN_END = "\n\n\nif __name__ == '__main__':"
WEIGHT_CHECK = Edit(MAIN_END, """
    # (added) The largest spread of any trainable weight across the ranks.
    import horovod.tensorflow as hvd_tf
    spread = max(float(tf.reduce_max(tf.reduce_max(g, 0) - tf.reduce_min(g, 0)))
                 for g in (hvd_tf.allgather(tf.reshape(w, [1, -1]))
                           for w in mnist_model.trainable_weights))
    if hvd.rank() == 0:
        print('Weight spread across ranks: %g' % spread)""" + MAIN_END,
    "added after training, not part of it: the largest difference of any trainable weight "
    "between the ranks at the end (allgathered), which shows whether the gradients were "
    "averaged (a run on local gradients still trains, with its ranks apart)")

# Each example's edits beyond the data line: the Keras 3 API changes in the example's own
# code, the shortening that lets a 2-core CPU run it before and after in minutes, and the
# weight check.
EXAMPLES = {
    "tensorflow2_mnist": {
        "path": "examples/tensorflow2/tensorflow2_mnist.py",
        "elastic": False,
        "edits": (
            Edit("hvd.broadcast_variables(opt.variables(), root_rank=0)",
                 "hvd.broadcast_variables(opt.variables, root_rank=0)",
                 "Keras 3: an optimizer's `variables` is a list, not a method "
                 "(`'list' object is not callable`)"),
            Edit("dataset.take(10000 // hvd.size())", "dataset.take(400 // hvd.size())",
                 "shortened: 200 steps a worker at -np 2, not 5000 (about 75 min a run at the "
                 "0.93 s a step measured on the shared 2-core CPU); the loss falls well "
                 "within them"),
            WEIGHT_CHECK,
        ),
    },
    "tensorflow2_keras_mnist": {
        "path": "examples/tensorflow2/tensorflow2_keras_mnist.py",
        "elastic": False,
        "edits": (
            Edit(",\n                        experimental_run_tf_function=False)", ")",
                 "Keras 3's `compile()` rejects `experimental_run_tf_function` (an unknown "
                 "argument); Keras 3 fit always calls the optimizer's `apply()`, which is "
                 "where the patched DistributedOptimizer averages"),
            Edit("steps_per_epoch=500 // hvd.size(), callbacks=callbacks, epochs=24",
                 "steps_per_epoch=120 // hvd.size(), callbacks=callbacks, epochs=4",
                 "shortened: 4 epochs of 60 steps a worker at -np 2, not 24 of 250 (6000 "
                 "steps, about 70 min a run at the 0.68 s a step measured on the shared "
                 "2-core CPU); 4 epochs still pass the 3-epoch learning-rate warm-up"),
            WEIGHT_CHECK,
        ),
    },
    "tensorflow2_mnist_elastic": {
        "path": "examples/elastic/tensorflow2/tensorflow2_mnist_elastic.py",
        "elastic": True,
        "edits": (
            Edit("opt.lr.assign(lr * hvd.size())", "opt.learning_rate.assign(lr * hvd.size())",
                 "Keras 3 optimizers have no `lr` (only `learning_rate`); this reset "
                 "callback runs only when the hosts change, which these runs never do, so "
                 "the run does not show it"),
            WEIGHT_CHECK,
        ),
    },
}


def apply_edits(source: str, edits) -> str:
    """`source` with each edit's old text, found exactly once, replaced by its new text."""
    for edit in edits:
        found = source.count(edit.old)
        if found != 1:
            raise ValueError(f"{edit.old!r} is in the example {found} times, not once: "
                             "the edit no longer matches")
        source = source.replace(edit.old, edit.new)
    return source


def edited_example(source: str, name: str, idx_dir: str) -> str:
    data = Edit(DATA_LINE, DATA_CALL.format(idx=idx_dir), "MNIST offline")
    return apply_edits(source, (data,) + EXAMPLES[name]["edits"])


def horovodrun_command(args, controller: str, name: str, scratch: Path) -> list[str]:
    if EXAMPLES[name]["elastic"]:
        # Elastic runs on Gloo alone; the script lists this one host with two slots. Without
        # a named interface the elastic driver waits for a second host to find the hosts'
        # common interface (gloo_run._get_min_start_hosts): name the loopback.
        discovery = scratch / "discover_hosts.sh"
        discovery.write_text("#!/bin/sh\necho localhost:2\n")
        discovery.chmod(0o755)
        hosts = ["--min-np", "1", "--max-np", "2", "--host-discovery-script", str(discovery),
                 "--network-interface", "lo"]
    else:
        hosts = ["-H", "localhost:2"]
    return [args.horovodrun, f"--{controller}", "-np", "2", *hosts, args.python,
            f"{name}.py"]


LOSS_LINE = re.compile(r"(Step #\d+\s+Loss: \S+|\d+/\d+ .*loss: .*)$")
SPREAD_LINE = re.compile(r"^Weight spread across ranks: (\S+)$")
HOROVOD_FRAME = re.compile(r'^File ".*/(horovod/[^"]+)", line (\d+), in (\S+)')
ERROR_LINE = re.compile(r"^\w+(\.\w+)*(Error|Exception)\b")
# horovodrun's prefix starts every chunk a worker writes, so also after a carriage return.
OUTPUT_PREFIX = re.compile(r"\[[\d,]+\]<std(out|err)>:")
# Keras's progress bar: its colours and backspaces, then the bar itself.
PROGRESS_CONTROLS = re.compile(r"\x1b\[[0-9;]*m|\x08")
PROGRESS_BAR = re.compile(r"\s*━+")


def summarize(log: str) -> dict:
    """The first and last loss lines, and the last error line a worker printed (the cause,
    rather than the launcher's report of it), without horovodrun's `[rank]<stdout>:`."""
    worker_lines, launcher_lines = [], []
    for line in log.split("\n"):
        clean = PROGRESS_CONTROLS.sub("", OUTPUT_PREFIX.sub("", line))
        clean = PROGRESS_BAR.sub("", clean)
        # A progress bar rewrites its line with carriage returns: each state is a line.
        (worker_lines if OUTPUT_PREFIX.match(line) else launcher_lines).extend(
            part.strip() for part in clean.split("\r"))
    losses = [found.group(1) for line in worker_lines if (found := LOSS_LINE.search(line))]
    errors = ([line for line in worker_lines if ERROR_LINE.match(line)]
              or [line for line in launcher_lines
                  if ERROR_LINE.match(line) or "exited with" in line])
    spreads = [found.group(1) for line in worker_lines if (found := SPREAD_LINE.match(line))]
    # Where in Horovod's code a failure was raised: the last traceback frame inside it.
    frames = [f"{found.group(1)}:{found.group(2)} ({found.group(3)})"
              for line in worker_lines if (found := HOROVOD_FRAME.match(line))]
    return {"first_loss": losses[0] if losses else "", "last_loss": losses[-1] if losses else "",
            "loss_lines": len(losses), "error": errors[-1] if errors else "",
            "weight_spread": spreads[-1] if spreads else "",
            "horovod_frame": frames[-1] if frames and errors else ""}


def read_log(path: Path) -> str:
    """A run's log with its carriage returns kept: a progress bar's states follow one
    `[rank]<stdout>:` prefix, separated by them (Python's universal newlines would make
    each state a line of its own, without the prefix that marks it a worker's)."""
    with path.open(newline="") as f:
        return f.read()


def summarize_again(record: dict) -> None:
    """Each run's summary read again from its kept log (the log is the record)."""
    for stages in (s for example in record["runs"].values() for s in example.values()):
        for run in stages.values():
            if Path(run["log"]).exists():
                run.update(summarize(read_log(Path(run["log"]))))


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_example(args, controller: str, stage: str, name: str, overlay: Path) -> dict:
    scratch = Path(args.out).resolve() / "scratch" / controller / stage / name
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    source = (Path(args.horovod_src) / EXAMPLES[name]["path"]).read_text()
    (scratch / f"{name}.py").write_text(edited_example(source, name, args.idx_dir))
    command = horovodrun_command(args, controller, name, scratch)
    # The overlay's horovod first, then this repository (the data line imports from it).
    env = launch.environment({"PYTHONPATH": f"{overlay}{os.pathsep}{ROOT}"})
    horovod_suite.check_overlay(args.python, env, scratch, overlay)
    log = scratch / "horovodrun.log"
    load_before, start = load_average(), time.monotonic()
    with log.open("w") as out:
        try:
            returncode = subprocess.run(command, cwd=scratch, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            returncode = "timeout"
    return {"returncode": returncode, "seconds": round(time.monotonic() - start),
            "load": [load_before, load_average()], "log": str(log),
            "command": " ".join(command[:-2] + ["python", command[-1]]),
            **summarize(read_log(log))}


def run(args) -> None:
    patches = horovod_suite.python_only(horovod_suite.patches_from_pins(Path(args.pins)))
    installed = horovod_suite.installed_horovod(args.python)
    # Absolute: the runs' working directories are elsewhere, and PYTHONPATH names the overlay.
    out = Path(args.out).resolve()
    previous = out / "results.json"  # runs of some examples keep the others' results
    record = json.loads(previous.read_text()) if previous.exists() else {"runs": {}}
    record["patches"] = [p.name for p in patches]
    record["environment"] = horovod_suite.environment(args)
    for stage in args.stages:
        overlay = out / "overlay" / stage
        horovod_suite.make_overlay(installed, patches, stage, overlay)
        for controller in args.controllers:
            for name in args.examples:
                if controller != "gloo" and EXAMPLES[name]["elastic"]:
                    continue  # Horovod's elastic mode is Gloo's
                print(f"horovod-examples: {controller} {stage} {name}", flush=True)
                result = run_example(args, controller, stage, name, overlay)
                print(f"horovod-examples:   exit {result['returncode']} in "
                      f"{result['seconds']} s; {result['last_loss'] or result['error']}",
                      flush=True)
                record["runs"].setdefault(name, {}).setdefault(controller, {})[stage] = result
                previous.write_text(json.dumps(record, indent=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="run the examples, then write the report")
    horovod_suite.add_run_arguments(run_parser, "the examples")
    run_parser.add_argument("--idx_dir", required=True, help="the IDX files make data wrote")
    run_parser.add_argument("--examples", nargs="+", choices=list(EXAMPLES),
                            default=list(EXAMPLES))
    run_parser.add_argument("--stages", nargs="+", choices=horovod_suite.STAGES,
                            default=list(horovod_suite.STAGES))
    run_parser.add_argument("--timeout", type=int, default=RUN_TIMEOUT_SECONDS)
    for p in (run_parser, sub.add_parser("report", help="the report from results.json")):
        p.add_argument("--out", default=str(ROOT / "build" / "horovod-examples"))
        p.add_argument("--report", default=str(ROOT / "reports" / "horovod_examples.md"))
    args = parser.parse_args(argv)
    if args.action == "run":
        missing = [e["path"] for e in EXAMPLES.values()
                   if not (Path(args.horovod_src) / e["path"]).exists()]
        if missing:
            raise SystemExit(f"horovod-examples: {args.horovod_src} is not an unpacked Horovod "
                             f"v0.28.1 source tree (no {missing[0]})")
        run(args)
    from tools import horovod_examples_report
    if args.action == "report":
        results = Path(args.out) / "results.json"
        record = json.loads(results.read_text())
        summarize_again(record)
        results.write_text(json.dumps(record, indent=1))
    horovod_suite.write_report(args, horovod_examples_report.render, "horovod-examples")


if __name__ == "__main__":
    main()
