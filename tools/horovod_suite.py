"""Horovod's own test suite (tag v0.28.1, test/parallel) against the venv's Horovod, before
and after this project's patches to it; writes reports/horovod_suite.md (make horovod-suite).

Horovod's tests are not in its sdist: HOROVOD_SRC is an unpacked source tree of the tag,
kept outside this repository. One compiled Horovod serves both runs: the patches that change
only Python files are reversed ("before") or applied ("after") in two copies of the installed
package, put first on PYTHONPATH (horovodrun hands its environment to the workers). Each
file runs under `horovodrun -np 2` with a timeout and Horovod's stall check; each rank
writes a JUnit file, and a test counts as failed when it failed on any rank.

test/integration's TensorFlow 2 elastic and static-run files run under plain pytest in
one process (their tests start horovodrun themselves, elastic ones on two local "hosts"
of two slots each, localhost and 127.0.0.1; static-run's mixed and remote modes skip
themselves without password-less ssh to localhost), with the venv's bin first on PATH for
the `python` their workers run.

A test still failing after the patches is run again in a scratch copy of its file in which
only that test's own use of an API Keras 3 or NumPy 2 removed is changed
(tools/horovod_suite_cases.py): passing there shows the failure is the test's, not Horovod's.
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hvd_mnist.verification import launch  # noqa: E402
from tools import horovod_suite_cases  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FILES = ("test_tensorflow.py", "test_tensorflow_process_sets.py", "test_tensorflow2_keras.py",
         "test_tensorflow2_keras_process_sets.py", "test_common.py")
INTEGRATION_FILES = ("test_elastic_tensorflow2.py", "test_static_run.py")
STAGES = ("before", "after")
# What one test's ranks together say: a failure on any rank is a failure.
OUTCOME_RANK = {"failed": 3, "passed": 2, "skipped": 1}
FILE_TIMEOUT_SECONDS = 1800


def patches_from_pins(pins_file: Path) -> list[Path]:
    names = re.findall(r"^# horovod-patch: (\S+)$", pins_file.read_text(), re.M)
    return [ROOT / "tools" / "horovod-patches" / name for name in names]


def patched_files(patch: Path) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)


def python_only(patches: list[Path]) -> list[Path]:
    """The patches that a copy of the installed package can take or give back: those that
    change Python files of the horovod package alone (not the build)."""
    return [p for p in patches
            if all(f.startswith("horovod/") and f.endswith(".py") for f in patched_files(p))]


def _patch_applies(tree: Path, patch: Path, reverse: bool) -> bool:
    args = ["patch", "-p1", "-d", str(tree), "--dry-run", "-s", "-f"] + (["-R"] if reverse else [])
    return subprocess.run(args, stdin=patch.open(), capture_output=True).returncode == 0


def installed_horovod(python: str) -> Path:
    """The directory of the horovod package `python` imports: what an overlay patches."""
    return Path(subprocess.run(
        [python, "-c", "import horovod, os; print(os.path.dirname(horovod.__file__))"],
        capture_output=True, text=True, check=True).stdout.strip())


def make_overlay(installed: Path, patches: list[Path], stage: str, dest: Path) -> None:
    """dest/horovod: the installed package with `patches` applied (after) or reversed (before)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(installed, dest / "horovod", ignore=shutil.ignore_patterns("__pycache__"))
    for patch in (patches if stage == "after" else reversed(patches)):
        want_applied = stage == "after"
        if _patch_applies(dest, patch, reverse=want_applied):
            continue  # already as wanted
        if not _patch_applies(dest, patch, reverse=not want_applied):
            raise SystemExit(f"horovod-suite: {patch.name} neither applies to nor reverses from "
                             f"the installed Horovod ({installed})")
        args = ["patch", "-p1", "-d", str(dest), "-s", "-f"] + ([] if want_applied else ["-R"])
        subprocess.run(args, stdin=patch.open(), check=True)


def check_overlay(python: str, env: dict, cwd: Path, overlay: Path) -> None:
    """Stops the run unless `python`, started as the runs start it, imports the overlay's
    horovod (a relative PYTHONPATH from another directory silently gives the installed one)."""
    found = subprocess.run([python, "-c", "import horovod; print(horovod.__file__)"], env=env,
                           cwd=cwd, capture_output=True, text=True).stdout.strip()
    if not found.startswith(f"{overlay}{os.sep}"):
        raise SystemExit(f"horovod-suite: the runs would import {found or 'no horovod'}, "
                         f"not the overlay {overlay}")


def parse_junit(xml_text: str) -> dict[str, tuple[str, str]]:
    """{test id: (passed|failed|skipped, first line of the failure or skip message)}."""
    results = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message") or (child.text or "")
                break
            if child.tag == "skipped":
                outcome, message = "skipped", child.get("message") or ""
        results[test_id] = (outcome, message.strip().splitlines()[0] if message.strip() else "")
    return results


def combine_ranks(per_rank: list[dict]) -> dict[str, tuple[str, str]]:
    """Each test's worst outcome over the ranks; a test one rank never reported failed."""
    combined = {}
    for results in per_rank:
        for test_id, (outcome, message) in results.items():
            old = combined.get(test_id)
            if old is None or OUTCOME_RANK[outcome] > OUTCOME_RANK[old[0]]:
                combined[test_id] = (outcome, message)
    for test_id in combined:
        if any(test_id not in results for results in per_rank):
            combined[test_id] = ("failed", "not reported by every rank")
    return combined


def counts(results: dict) -> dict[str, int]:
    tally = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome, _ in results.values():
        tally[outcome] += 1
    return tally


def run_file(args, controller: str, test_dir: Path, test_file: str, pythonpath: Path,
             junit_dir: Path, node_ids=()) -> dict:
    """One file's tests (or the given node ids) under horovodrun -np 2 (test/integration's:
    pytest alone); the ranks' results, combined, with the wall time and whether it ended
    by itself."""
    junit_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(test_file).stem
    for old in junit_dir.glob(f"{stem}.rank*.xml"):
        old.unlink()
    targets = " ".join(node_ids) if node_ids else test_file
    # Each rank names its own JUnit file: Gloo sets HOROVOD_RANK, Open MPI its own variable.
    worker = (f"exec {args.python} -m pytest -p no:cacheprovider -q "
              f"--junitxml={junit_dir}/{stem}.rank${{HOROVOD_RANK:-$OMPI_COMM_WORLD_RANK}}.xml "
              f"{targets}")
    command = [args.horovodrun, f"--{controller}", "-np", "2", "-H", "localhost:2",
               "sh", "-c", worker]
    env = launch.environment({"PYTHONPATH": str(pythonpath)})
    check_overlay(args.python, env, test_dir, pythonpath)
    ranks = 2
    if test_file in INTEGRATION_FILES:
        command = ["sh", "-c", worker.replace("${HOROVOD_RANK:-$OMPI_COMM_WORLD_RANK}", "0")]
        env["PATH"] = f"{Path(args.python).parent}{os.pathsep}{env['PATH']}"
        # What test/conftest.py adds, which pytest started in test/integration does not load.
        env["PYTHONPATH"] += f"{os.pathsep}{test_dir.parent / 'utils'}"
        ranks = 1
    start = time.monotonic()
    log = junit_dir / f"{stem}.{controller}.log"
    with log.open("w") as out:
        try:
            subprocess.run(command, cwd=test_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                           timeout=args.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    per_rank = [parse_junit(p.read_text()) for p in sorted(junit_dir.glob(f"{stem}.rank*.xml"))]
    results = combine_ranks(per_rank) if len(per_rank) == ranks else {}
    return {"results": results, "seconds": round(time.monotonic() - start),
            "timed_out": timed_out, "ranks_reported": len(per_rank), "ranks": ranks,
            "log": str(log)}


def scratch_evidence(args, controller: str, test_dir: Path, test_file: str, still_failing,
                     pythonpath: Path, out: Path) -> dict:
    """Runs the still-failing tests that horovod_suite_cases explains in a scratch copy of
    the test directory, each test's own removed-API use changed inside that test alone."""
    cases = {name: case for name, case in horovod_suite_cases.CASES.get(test_file, {}).items()
             if any(_function_name(t) == name for t in still_failing)}
    script = horovod_suite_cases.SCRIPT_CASES.get(test_file)
    if not cases and not script:
        return {}
    scratch = out / "scratch" / controller / Path(test_file).stem
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(test_dir.parent, scratch, ignore=shutil.ignore_patterns("__pycache__"))
    path = scratch / test_dir.name / test_file
    path.write_text(horovod_suite_cases.apply_edits(path.read_text(), cases))
    if script:
        script_path = scratch / test_dir.name / script[0]
        script_path.write_text(horovod_suite_cases.apply_script_edits(script_path.read_text(),
                                                                      script[1]))
    explained = [t for t in still_failing if script or _function_name(t) in cases]
    run = run_file(args, controller, scratch / test_dir.name, test_file, pythonpath,
                   out / "scratch-junit" / controller,
                   [_node_id(test_file, t) for t in explained])
    # Inside this repository's tree pytest names the copy's classes by their path from it.
    found = {_module_class(t): outcome for t, outcome in run["results"].items()}
    return {t: found.get(_module_class(t), ("failed", "not run in the scratch copy"))
            for t in explained}


def _module_class(test_id: str) -> str:
    """a.b.test_x.Tests::test_y -> test_x.Tests::test_y"""
    classname, name = test_id.split("::")
    return ".".join(classname.split(".")[-2:]) + "::" + name


def _function_name(test_id: str) -> str:
    """test_gradient_aggregation_0 (parameterized.expand's names) -> its function's name."""
    return re.sub(r"_\d+(_\w+)?$", "", test_id.split("::")[-1])


def _node_id(test_file: str, test_id: str) -> str:
    classname, name = test_id.split("::")
    return f"{test_file}::{classname.split('.')[-1]}::{name}"


def run(args) -> None:
    tests = Path(args.horovod_src) / "test"
    patches = python_only(patches_from_pins(Path(args.pins)))
    installed = installed_horovod(args.python)
    # Absolute: the runs' working directories are elsewhere, and PYTHONPATH names the overlay.
    out = Path(args.out).resolve()
    # A run of some controllers keeps the others' results from an earlier run.
    previous = out / "results.json"
    record = json.loads(previous.read_text()) if previous.exists() else {"controllers": {}}
    # The report's header names the first run's patches; a section run with others names its own.
    record.setdefault("patches", [p.name for p in patches])
    for controller in args.controllers + (["integration"] if args.integration_files else []):
        # test/integration's files run once, outside horovodrun; they pick their controllers.
        integration = controller == "integration"
        test_dir = tests / ("integration" if integration else "parallel")
        files = args.integration_files if integration else args.files
        if not files:
            continue  # an earlier run's results for it stay as they are
        record["controllers"].setdefault(controller, {})
        if set(args.stages) == set(STAGES):
            for test_file in files:
                record["controllers"][controller].pop(test_file, None)
        record.setdefault("environments", {})[controller] = {
            **environment(args), "patches": [p.name for p in patches]}
        for stage in args.stages:
            overlay = out / "overlay" / stage
            make_overlay(installed, patches, stage, overlay)
            for test_file in files:
                print(f"horovod-suite: {controller} {stage} {test_file}", flush=True)
                result = run_file(args, controller, test_dir, test_file, overlay,
                                  out / "junit" / controller / stage)
                if stage == "after":
                    failing = sorted(t for t, (o, _) in result["results"].items() if o == "failed")
                    result["scratch"] = scratch_evidence(args, controller, test_dir, test_file,
                                                         failing, overlay, out)
                record["controllers"][controller].setdefault(test_file, {})[stage] = result
                print(f"horovod-suite:   {counts(result['results'])} in {result['seconds']} s",
                      flush=True)
            (out / "results.json").write_text(json.dumps(record, indent=1))


def environment(args) -> dict:
    # tf.keras's own package: keras, or tf_keras where TF_USE_LEGACY_KERAS asks for it.
    versions = subprocess.run(
        [args.python, "-c", "import horovod, importlib, numpy, tensorflow as tf; "
         "k = importlib.import_module(tf.keras.layers.__name__.split('.')[0]); "
         "print(horovod.__version__, tf.__version__, f'{k.__name__}-{k.__version__}', "
         "numpy.__version__, __import__('platform').python_version())"],
        capture_output=True, text=True).stdout.split()
    cpu = "unknown"
    flags = ""
    if Path("/proc/cpuinfo").exists():
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        cpu = found.group(1).strip() if found else cpu
        found = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
        flags = found.group(1) if found else ""
    isa = "AVX-512" if "avx512f" in flags.split() else "AVX2-only" if "avx2" in flags.split() else "no AVX2"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    names = ("horovod", "tensorflow", "tf.keras", "numpy", "python")
    return {"cpu": f"{cpu} ({isa}), {os.cpu_count()} cores", "commit": commit + ("+dirty" if dirty else ""),
            "versions": dict(zip(names, versions)), "date": time.strftime("%Y-%m-%d"),
            "host": platform.node(), "command": " ".join(sys.argv[1:])}


def add_run_arguments(run_parser, what_python_runs: str) -> None:
    """A run's arguments that tools/horovod_examples.py shares."""
    run_parser.add_argument("--horovod_src", required=True)
    run_parser.add_argument("--python", required=True,
                            help=f"the Python that runs {what_python_runs}")
    run_parser.add_argument("--horovodrun", required=True)
    run_parser.add_argument("--pins", required=True, help="the pins file naming the patches")
    run_parser.add_argument("--controllers", nargs="+", default=["gloo"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="run the suite, then write the report")
    add_run_arguments(run_parser, "pytest")
    run_parser.add_argument("--files", nargs="*", default=list(FILES))
    run_parser.add_argument("--integration_files", nargs="*", default=list(INTEGRATION_FILES))
    run_parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                            help="one stage again, keeping the other's earlier results")
    run_parser.add_argument("--timeout", type=int, default=FILE_TIMEOUT_SECONDS)
    run_parser.add_argument("--out", default=str(ROOT / "build" / "horovod-suite"))
    run_parser.add_argument("--report", default=str(ROOT / "reports" / "horovod_suite.md"))
    report_parser = sub.add_parser("report", help="write the report from a run's results.json")
    report_parser.add_argument("--out", default=str(ROOT / "build" / "horovod-suite"))
    report_parser.add_argument("--report", default=str(ROOT / "reports" / "horovod_suite.md"))
    args = parser.parse_args(argv)
    if args.action == "run":
        if not (Path(args.horovod_src) / "test" / "parallel" / "test_tensorflow.py").exists():
            raise SystemExit(f"horovod-suite: {args.horovod_src} is not an unpacked Horovod "
                             "v0.28.1 source tree (no test/parallel/test_tensorflow.py)")
        run(args)
    from tools import horovod_suite_report
    write_report(args, horovod_suite_report.render, "horovod-suite")


def write_report(args, render, label: str) -> None:
    """args.report, rendered from args.out's results.json."""
    record = json.loads((Path(args.out) / "results.json").read_text())
    Path(args.report).write_text(render(record))
    print(f"{label}: wrote {args.report}")


if __name__ == "__main__":
    main()
