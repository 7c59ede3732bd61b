"""make bench-elastic: what --elastic costs without a failure, and how fast it recovers from
one, on one machine (docs/elastic.md, What it costs).

    python -m tools.bench.elastic [--repeats=5]    (8 min on the AVX2-only EPYC, bdd133f)

Throughput: the same short custom-loop run at -np 2, "normal" and "elastic" (on two
one-slot hosts, ELASTIC_HOSTS, with --threads_per_rank=1), taking turns so that a change in
the machine's load hits both alike; medians of steady images/s (steady_state.py), of
training images/s (summary.json's, tracing included: the windows leave out what happens
between them, not the same on both paths) and of the elastic runs' time in commits.
Recovery: rank 1 of an elastic run SIGKILLed after its first commit; from rank 0's output
lines, the seconds to the survivor's restart, first step and first commit, and where it
restarted.
"""

import os
import re
import shutil
import signal
import subprocess
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tools.bench import launch, machine, steady_state, tables  # noqa: E402

FLAGS = flags.FLAGS
DISCOVER = os.path.join(launch.REPO_ROOT, "tools", "discover_hosts.sh")
ELASTIC_HOSTS = ("localhost:1", "127.0.0.1:1")
VARIANTS = {"normal": [], "elastic": ["--elastic", "--threads_per_rank=1"]}
REPORT = "reports/elastic.json"  # and .md beside it
COMMIT_EVERY = 20  # --commit_every of the recovery run (the default)


def define_flags():
    flags.DEFINE_string("data_dir", "data/tfds", "The prepared mnist (make data).")
    flags.DEFINE_string("out_dir", "runs/bench_elastic", "Where the runs and their logs go.")
    flags.DEFINE_list("run_flags", ["--epochs=2", "--max_steps_per_epoch=60", "--batch_size=128",
                                    "--log_every=0"], "hvd_mnist.main flags of every run.")
    flags.DEFINE_integer("repeats", 5, "Runs of each variant, taking turns.", lower_bound=1)
    flags.DEFINE_float("timeout", 900, "Seconds before a run counts as hung.")


def elastic_command(program: list) -> list:
    """Elastic horovodrun at -np 2 on ELASTIC_HOSTS (tools/discover_hosts.sh reads the file)."""
    return launch.elastic_command(2, len(ELASTIC_HOSTS), DISCOVER, program)


def _hosts_env(out_dir: str) -> dict:
    hosts_file = os.path.join(out_dir, "elastic_hosts.txt")
    with open(hosts_file, "w") as f:
        f.write("".join(host + "\n" for host in ELASTIC_HOSTS))
    return {"HVD_MNIST_HOSTS_FILE": hosts_file}


def _fresh(model_dir: str) -> str:
    """An empty model_dir: an earlier bench's files would be read as this run's."""
    shutil.rmtree(model_dir, ignore_errors=True)
    return model_dir


def throughput_run(name: str, variant: str, out_dir: str) -> dict:
    model_dir = _fresh(os.path.abspath(os.path.join(out_dir, name)))
    program = launch.python_module(
        "hvd_mnist.main", f"--data_dir={os.path.abspath(FLAGS.data_dir)}",
        f"--model_dir={model_dir}", *FLAGS.run_flags, *VARIANTS[variant])
    command = (elastic_command(program) if "--elastic" in VARIANTS[variant]
               else launch.horovodrun_command(2, program))
    log_path = os.path.join(out_dir, f"{name}.log")
    rc, _ = launch.run_logged(command, log_path, FLAGS.timeout, _hosts_env(out_dir))
    if rc != 0:
        raise SystemExit(f"bench: run {name} failed ({rc}); see {log_path}")
    summary = launch.read_summary(model_dir)
    figures = {"images_per_second": steady_state.images_per_second(
        summary["timing"]["window_images_per_second"]),
        "training_images_per_second": summary["images_per_second"]}
    if "elastic" in summary:
        elastic = summary["elastic"]
        figures.update(commits=elastic["commits"], commit_seconds=elastic["commit_seconds"],
                       train_seconds=summary["train_seconds"])
    return figures


def throughput(out_dir: str) -> dict:
    runs = {variant: [] for variant in VARIANTS}
    for repeat in range(1, FLAGS.repeats + 1):
        for variant in VARIANTS:
            runs[variant].append(throughput_run(f"{variant}-{repeat}", variant, out_dir))
            print(f"bench: {variant} run {repeat}: "
                  f"{runs[variant][-1]['images_per_second']:.0f} images/s", flush=True)
    medians = {variant: steady_state.median_of_runs(rs) for variant, rs in runs.items()}
    over_normal = lambda key: {v: m[key] / medians["normal"][key]  # noqa: E731
                               for v, m in medians.items()}
    return {
        "images_per_second": {v: [r["images_per_second"] for r in rs]
                              for v, rs in runs.items()},
        "medians": medians,
        "over_normal": over_normal("images_per_second"),
        "training_over_normal": over_normal("training_images_per_second"),
        # Share of the elastic runs' training seconds spent in commits.
        "commit_share": {v: m["commit_seconds"] / m["train_seconds"]
                         for v, m in medians.items() if "commit_seconds" in m},
    }


def logged(output, log):
    """The lines of a job's output as they come, each also written to log."""
    for line in output:
        log.write(line)
        yield line


def next_match(lines, pattern: str):
    """(time.time() when it was read, match) of the next of `lines` that matches pattern."""
    for line in lines:
        match = re.search(pattern, line)
        if match:
            return time.time(), match
    raise SystemExit(f"bench: the recovery run ended before a line matching {pattern!r}")


def worker_pid(rank: int, launcher: int) -> int:
    """The pid of the hvd_mnist.main worker the launcher (horovodrun, pid `launcher`) started
    as `rank` (its environment's HOROVOD_RANK: a worker's first rank, which is all the kill
    needs); a worker of another job on the machine is not the launcher's descendant."""
    import psutil  # Horovod's dependency
    for process in psutil.Process(launcher).children(recursive=True):
        try:
            # argv, not a shell's one-string command line holding the same words
            if ("hvd_mnist.main" in process.cmdline()
                    and process.environ().get("HOROVOD_RANK") == str(rank)):
                return process.pid
        except psutil.Error:  # ended, or not ours to read
            continue
    raise SystemExit(f"bench: no hvd_mnist worker of rank {rank} found")


# Rank 0's lines (--progress=lines --log_every=1): a step's line is printed before that step's
# commit, so the line of the step after a commit is the first sign the commit is done.
STEP = r"epoch (\d+)/\d+ step (\d+)/\d+: loss"
START = r"elastic: start {start} on (\d+) worker\(s\) at epoch (\d+), example (\d+) "


def recovery(out_dir: str) -> dict:
    """Rank 1 SIGKILLed after the first commit, timed from rank 0's own output lines."""
    model_dir = _fresh(os.path.abspath(os.path.join(out_dir, "recovery")))
    run_flags = [f for f in FLAGS.run_flags if not f.startswith(("--log_every", "--progress"))]
    program = launch.python_module(
        "hvd_mnist.main", f"--data_dir={os.path.abspath(FLAGS.data_dir)}",
        f"--model_dir={model_dir}", *run_flags, *VARIANTS["elastic"], "--progress=lines",
        "--log_every=1", f"--commit_every={COMMIT_EVERY}")
    with open(os.path.join(out_dir, "recovery.log"), "w") as log:
        process = subprocess.Popen(elastic_command(program), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, cwd=launch.REPO_ROOT,
                                   env=launch.environment(_hosts_env(out_dir)))
        # A hung run is killed; Horovod's middlemen end its workers, and so its output.
        watchdog = threading.Timer(FLAGS.timeout, process.kill)
        watchdog.start()
        try:
            lines = logged(process.stdout, log)
            next_match(lines, rf"epoch 1/\d+ step {COMMIT_EVERY + 1}/")  # after the first commit
            os.kill(worker_pid(1, process.pid), signal.SIGKILL)
            killed = time.time()
            restarted_at, restart = next_match(lines, START.format(start=2))
            first_step_at, first = next_match(lines, STEP)
            committed_step = int(first.group(2)) + COMMIT_EVERY - 1
            first_commit_at, _ = next_match(
                lines, rf"epoch {first.group(1)}/\d+ step {committed_step + 1}/")
            for _ in lines:  # the rest of the run, into the log
                pass
            rc = process.wait()
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
    if rc != 0:
        raise SystemExit(f"bench: the recovery run failed ({rc}); see {out_dir}/recovery.log")
    return {"kill_to_restart_seconds": restarted_at - killed,
            "kill_to_first_step_seconds": first_step_at - killed,
            "kill_to_first_commit_seconds": first_commit_at - killed,
            "restarted_at": {"epoch": int(restart.group(2)), "position": int(restart.group(3)),
                             "workers": int(restart.group(1))}}


def markdown(report: dict) -> str:
    t, r = report["throughput"], report["recovery"]
    rows = []
    for variant in VARIANTS:
        rates = t["images_per_second"][variant]
        share = t["commit_share"].get(variant)
        rows.append([variant, tables.figure(t["medians"][variant]["images_per_second"]),
                     f"{tables.figure(min(rates))}-{tables.figure(max(rates))}",
                     tables.ratio(t["over_normal"][variant]),
                     tables.figure(t["medians"][variant]["training_images_per_second"]),
                     tables.ratio(t["training_over_normal"][variant]),
                     tables.MISSING if share is None else f"{100 * share:.1f}%"])
    return "\n".join([
        "# make bench-elastic", "",
        f"{report['started']}, {report['machine']}. Every run: -np 2, "
        f"`{' '.join(report['run_flags'])}`; {report['repeats']} runs of each, taking "
        "turns; medians (tools/bench/elastic.py says what each variant is).", "",
        tables.markdown(["variant", "steady images/s", "lowest-highest", "over normal",
                         "training images/s", "over normal", "time in commits"], rows), "",
        f"Recovery: rank 1 SIGKILLed after the first commit; from rank 0's lines, the "
        f"survivor's restart {tables.figure(r['kill_to_restart_seconds'])} s, first step "
        f"{tables.figure(r['kill_to_first_step_seconds'])} s and first commit "
        f"{tables.figure(r['kill_to_first_commit_seconds'])} s after the kill, restarting "
        f"at epoch {r['restarted_at']['epoch']}, example {r['restarted_at']['position']}, "
        f"on {r['restarted_at']['workers']} worker(s).", ""])


def main(argv):
    del argv
    out_dir = os.path.abspath(FLAGS.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    report = {"started": machine.now(), "machine": machine.description(),
              "run_flags": FLAGS.run_flags, "repeats": FLAGS.repeats,
              "throughput": throughput(out_dir), "recovery": recovery(out_dir)}
    tables.write(REPORT, report, markdown(report))


if __name__ == "__main__":
    define_flags()
    app.run(main)
