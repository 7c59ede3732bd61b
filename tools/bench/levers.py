"""Part 5 of make bench, after the example: the training step's levers (step_levers.py)
at -np 2, one against two TF threads per rank at -np 2 and 4, and the start-up levers
measured in the bench's own process."""

import json
import os
import sys

from tools.bench import in_process, launch, tables


def run_step_levers(np_: int, out_prefix: str, flags: list) -> dict:
    """One job of step_levers.py on np_ ranks; its rank 0's result."""
    rc, _ = launch.job(np_, launch.python_module("tools.bench.step_levers",
                                                 f"--report={out_prefix}.json", *flags),
                       out_prefix + ".log", timeout_seconds=900)
    if rc != 0:
        sys.exit(f"bench: step_levers failed ({rc}); see {out_prefix}.log")
    with open(out_prefix + ".json") as f:
        return json.load(f)


def measure(results: dict, data_dir: str, out_dir: str) -> None:
    results["startup_levers"] = in_process.startup_seconds(data_dir)
    print(startup_sentence(results["startup_levers"]), flush=True)
    results["step_levers"] = run_step_levers(2, os.path.join(out_dir, "step_levers_np2"),
                                             ["--windows=12"])
    results["threads"] = {f"np{np_}_threads{threads}": run_step_levers(
        np_, os.path.join(out_dir, f"threads_np{np_}_{threads}"),
        ["--windows=10", "--only=hvd_mnist", f"--threads_per_rank={threads}"])
        for np_ in (2, 4) for threads in (1, 2)}


def startup_sentence(seconds: dict) -> str:
    return ("Start-up levers, seconds in one process: " + ", ".join(
        f"{k.replace('_', ' ')} {tables.figure(v)}" for k, v in seconds.items()) + ".")


def table(levers, threads) -> str:
    f = tables.figure
    steps = tables.markdown(
        ["step", "images/s", "over hvd_mnist's step", "first call s"],
        [[name, f(rate), tables.ratio(levers["over_hvd_mnist"][name]),
          f(levers["first_call_seconds"][name])]
         for name, rate in levers["images_per_second"].items()])
    per_rank = tables.markdown(
        ["-np", "TF threads per rank", "images/s"],
        [[result["np"], result["threads_per_rank"], f(result["images_per_second"]["hvd_mnist"])]
         for result in threads.values()])
    return "\n".join([f"The step's levers at -np {levers['np']} ({levers['threads_per_rank']} "
                      "thread(s) per rank), taking turns in one job, synthetic batches:", "",
                      steps, "", per_rank])
