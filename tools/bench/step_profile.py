"""Where one training step's time goes in TensorFlow and in PyTorch, side by side: one
process, one thread, a synthetic batch of 128, the model and Adam of the job make bench sets
beside PyTorch DDP (versus_torch.py); then the gradients' allreduce at -np 2.

    python -m tools.bench.step_profile [--min_seconds=1] [--out=runs/bench/step_profile.json]

Runs step_profile_tf.py in this venv and step_profile_torch.py in the PyTorch venv (made when
missing, torch_venv.py), each in its own process: every layer's forward and backward, the
optimizer's update, the whole step, and each framework's own profiler's ops over whole
steps. Then at -np 2 under each launcher: Horovod's grouped allreduce of the gradients
(allreduce_probe.py) and torch.distributed.all_reduce of the same bytes over Gloo. Prints
the tables and writes their figures as JSON; a measurement for the record wants a quiet
machine.
"""

import argparse
import json
import os
import subprocess
import sys

from tools.bench import launch, machine, tables, torch_venv, versus_torch

TIMEOUT_SECONDS = 900
TOP_OPS = 12


def last_json_line(output: str, prefix: str) -> dict:
    """The JSON after `prefix` on the last line that starts with it; SystemExit without one."""
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    if not lines:
        raise SystemExit(f"step_profile: no line starting with {prefix!r} in:\n{output[-2000:]}")
    return json.loads(lines[-1][len(prefix):])


def run(command: list, prefix: str, env=None) -> dict:
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
                            cwd=launch.REPO_ROOT, env=launch.environment(env))
    if result.returncode != 0:
        raise SystemExit(f"step_profile: failed ({result.returncode}): {' '.join(command)}\n"
                         + (result.stdout + result.stderr)[-3000:])
    return last_json_line(result.stdout, prefix)


def measure(torch_python: str, min_seconds: float) -> dict:
    seconds = f"--min_seconds={min_seconds}"
    return {
        "tensorflow": run(launch.python_module("tools.bench.step_profile_tf", seconds),
                          "PROFILE "),
        "torch": run(launch.python_module("tools.bench.step_profile_torch", seconds,
                                          python=torch_python), "PROFILE "),
        "horovod_allreduce": run(launch.horovodrun_command(
            2, launch.python_module("tools.bench.allreduce_probe")), "[0]<stdout>:PROBE "),
        "torch_allreduce": run(versus_torch.torchrun_command(
            2, torch_python, "--allreduce", module="tools.bench.step_profile_torch"), "PROBE "),
    }


def pieces_table(profile: dict) -> str:
    tf_, pt = profile["tensorflow"], profile["torch"]
    rows = []
    for a, b in zip(tf_["pieces"], pt["pieces"]):
        rows.append([a["name"], *(tables.figure(v) for v in (
            a["forward_ms"], a["backward_ms"], b["forward_ms"], b["backward_ms"])),
            tables.ratio((a["forward_ms"] + a["backward_ms"])
                         / (b["forward_ms"] + b["backward_ms"]))])
    rows.append(["optimizer update (Adam)", tables.figure(tf_["optimizer_ms"]), "",
                 tables.figure(pt["optimizer_ms"]), "",
                 tables.ratio(tf_["optimizer_ms"] / pt["optimizer_ms"])])
    added = [sum(p["forward_ms"] + p["backward_ms"] for p in side["pieces"])
             + side["optimizer_ms"] for side in (tf_, pt)]
    rows.append(["the pieces, each timed alone, added up", tables.figure(added[0]), "",
                 tables.figure(added[1]), "", tables.ratio(added[0] / added[1])])
    rows.append(["**the whole step**", tables.figure(tf_["step_ms"]), "",
                 tables.figure(pt["step_ms"]), "", tables.ratio(tf_["step_ms"] / pt["step_ms"])])
    hvd, gloo = profile["horovod_allreduce"], profile["torch_allreduce"]
    rows.append([f"allreduce of the gradients at -np 2 ({hvd['gradient_bytes'] / 1e6:.1f} MB; "
                 "PyTorch: one flat buffer)", tables.figure(1e3 * hvd["allreduce_fp32_seconds"]),
                 "", tables.figure(1e3 * gloo["allreduce_flat_seconds"]), "",
                 tables.ratio(hvd["allreduce_fp32_seconds"] / gloo["allreduce_flat_seconds"])])
    rows.append(["the same, PyTorch tensor by tensor", "", "",
                 tables.figure(1e3 * gloo["allreduce_per_tensor_seconds"]), "", ""])
    return tables.markdown([f"one thread, batch {tf_['batch']}", f"{tf_['framework']}: forward ms",
                            "backward ms", f"{pt['framework']}: forward ms", "backward ms",
                            "TF / PyTorch"], rows)


def ops_table(side: dict) -> str:
    rows = [[op["op"], tables.figure(op["ms_per_step"]),
             f"{100 * op['ms_per_step'] / side['step_ms']:.0f}%"]
            for op in side["ops"][:TOP_OPS]]
    return tables.markdown([f"{side['framework']}'s profiler: op", "ms per step",
                            "of the step timed alone"], rows)


def markdown(profile: dict) -> str:
    return "\n\n".join([pieces_table(profile), ops_table(profile["tensorflow"]),
                        ops_table(profile["torch"])])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min_seconds", type=float, default=1.0,
                        help="Each piece is called for at least this long.")
    parser.add_argument("--torch_venv", default=torch_venv.DEFAULT_VENV)
    parser.add_argument("--out", default="runs/bench/step_profile.json")
    args = parser.parse_args(argv)
    profile = {"machine": machine.description(), "date": machine.now(),
               **measure(torch_venv.ensure(os.path.abspath(args.torch_venv)), args.min_seconds)}
    profile["load_average_after"] = os.getloadavg()[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(profile, f, indent=1)
    print(f"{profile['machine']}, {profile['date']}; load average at the end "
          f"{profile['load_average_after']:.1f}\n")
    print(markdown(profile))
    print(f"step_profile: wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
