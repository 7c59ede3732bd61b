"""What --elastic costs when nothing fails, and how long a lost worker stops training.

    .venv/bin/python tools/elastic_bench.py --data_dir=data/tfds   (about 8 minutes here)

1. Throughput: the same short run at -np 2 with and without --elastic, alternated
   (--repeats times each); images/s is the median of the 20-step windows after each
   run's first (which includes tracing), as in make bench.
2. Recovery: an elastic run at 2 workers; after --kill_after_steps steps rank 1 is
   SIGKILLed (and its host removed from the hosts file); reported are the seconds from
   the kill to the first step and to the first commit at 1 worker (from --example_log).
Writes reports/elastic.json.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISCOVER = os.path.join(ROOT, "tools", "discover_hosts.sh")
HOSTS = ("localhost:1", "127.0.0.1:1")


def trainer(data_dir, model_dir, *flags):
    # One thread per rank in both: each elastic "host" has one slot, so the default
    # (cores / local ranks) would give elastic workers two threads each.
    return ["-m", "hvd_mnist.main", f"--data_dir={data_dir}", f"--model_dir={model_dir}",
            "--log_every=0", "--threads_per_rank=1", *flags]


def elastic_command(hosts_file, args):
    return ([os.path.join(runlib.BIN_DIR, "horovodrun"), "-np", "2", "--min-np", "1",
             "--max-np", "2", "--host-discovery-script", DISCOVER, "--network-interface", "lo",
             "--elastic-timeout", "60", sys.executable, *args],
            {**os.environ, **runlib.STALL_ENV, "HVD_MNIST_HOSTS_FILE": hosts_file})


def write_hosts(path, hosts):
    with open(path, "w") as f:
        f.write("".join(f"{host}\n" for host in hosts))


def windows_median(model_dir):
    windows = runlib.read_summary(model_dir)["timing"]["window_images_per_second"]
    return statistics.median(windows[1:])


def throughput(data_dir, work, flags, repeats):
    results = {"normal": [], "elastic": []}
    for repeat in range(repeats):
        for kind in ("normal", "elastic"):
            model_dir = os.path.join(work, f"{kind}{repeat}")
            log = os.path.join(work, f"{kind}{repeat}.log")
            args = trainer(data_dir, model_dir, *flags)
            if kind == "normal":
                rc, seconds = runlib.launch(2, args, log, timeout_seconds=900)
            else:
                hosts = os.path.join(work, "hosts")
                write_hosts(hosts, HOSTS)
                command, env = elastic_command(hosts, args + ["--elastic"])
                with open(log, "w") as out:
                    rc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                        timeout=900).returncode
            if rc != 0:
                raise SystemExit(f"elastic_bench: {kind} run failed ({rc}); see {log}")
            results[kind].append(windows_median(model_dir))
            print(f"{kind} run {repeat + 1}: {results[kind][-1]:.0f} images/s", flush=True)
    return results


def log_records(directory):
    """Every process's example-log records so far, each with the process's pid."""
    records = []
    for name in os.listdir(directory):
        pid = int(name.split("-")[1].split(".")[0])  # examples-<pid>.jsonl
        with open(os.path.join(directory, name)) as f:
            records += [{**json.loads(line), "pid": pid} for line in f if line.endswith("}\n")]
    return records


def recovery(data_dir, work, flags, kill_after_steps):
    hosts = os.path.join(work, "recovery-hosts")
    write_hosts(hosts, HOSTS)
    model_dir = os.path.join(work, "recovery")
    examples = os.path.join(model_dir, "examples")
    command, env = elastic_command(hosts, trainer(data_dir, model_dir, *flags, "--elastic",
                                                  f"--example_log={examples}"))
    log = open(os.path.join(work, "recovery.log"), "w")
    job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    victim = None
    while victim is None:
        time.sleep(0.1)
        if job.poll() is not None:
            raise SystemExit(f"elastic_bench: the recovery run ended early; see {log.name}")
        if os.path.isdir(examples):
            steps = [r for r in log_records(examples) if "step" in r and r["rank"] == 1]
            if len(steps) >= kill_after_steps:
                victim = steps[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    # Out of the hosts file once the job has re-formed without it (README: Elastic training).
    while not any(r.get("start") == 2 for r in log_records(examples)):
        if job.poll() is not None:
            raise SystemExit(f"elastic_bench: the recovery run ended early; see {log.name}")
        time.sleep(0.1)
    # Its host, not a fixed one: the driver's first rank order is the hosts' hash order.
    victim_host = next(r["host"] for r in log_records(examples)
                       if r["pid"] == victim and "start" in r)
    write_hosts(hosts, [h for h in HOSTS if h.split(":")[0] != victim_host])
    # Exit 0 alone does not prove it finished: a driver that gives up waiting for hosts
    # ends the job with exit 0 (Horovod 0.28.1).
    if (job.wait(timeout=900) != 0
            or not os.path.exists(os.path.join(model_dir, "summary.json"))):
        raise SystemExit(f"elastic_bench: the recovery run failed; see {log.name}")
    records = log_records(examples)
    after = [r for r in records if r.get("size") == 1 and r["unix_time"] > killed_at]
    first_step = min(r["unix_time"] for r in after if "step" in r)
    first_commit = min(r["unix_time"] for r in after if "commit" in r)
    restart = next(r for r in after if "start" in r)
    return {"kill_to_first_step_seconds": first_step - killed_at,
            "kill_to_first_commit_seconds": first_commit - killed_at,
            "restarted_at": {"epoch": restart["epoch"], "position": restart["position"]}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default="data/tfds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kill_after_steps", type=int, default=30)
    parser.add_argument("--steps_per_epoch", type=int, default=60,
                        help="throughput runs: 2 epochs of this many steps")
    parser.add_argument("--recovery_epochs", type=int, default=1,
                        help="recovery run: full epochs (234 steps of 2 x 128 on MNIST)")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--output", default=os.path.join(ROOT, "reports", "elastic.json"))
    args = parser.parse_args()
    flags = ["--epochs=2", f"--steps_per_epoch={args.steps_per_epoch}",
             f"--batch_size={args.batch_size}"]
    started = runlib.now()
    work = tempfile.mkdtemp(prefix="elastic_bench")  # kept when a run fails, for its log
    rates = throughput(args.data_dir, work, flags, args.repeats)
    recovered = recovery(args.data_dir, work, [f"--epochs={args.recovery_epochs}",
                                               f"--batch_size={args.batch_size}"],
                         args.kill_after_steps)
    shutil.rmtree(work)
    report = {"started": started, "machine": runlib.machine_description(),
              "flags": flags, "images_per_second": rates,
              "elastic_over_normal": statistics.median(rates["elastic"])
              / statistics.median(rates["normal"]),
              "recovery": recovered}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
