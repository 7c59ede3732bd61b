"""reports/horovod_examples.md from tools/horovod_examples.py's results.json: per example,
every edit beyond the data line and why, and each run before and after the patches (result,
wall time, first and last loss lines, the load beside it)."""

import os

from tools.horovod_examples import DATA_LINE, EXAMPLES, RUN_TIMEOUT_SECONDS
from hvd_mnist.verification.launch import DEFAULT_ENV


def render(record: dict) -> str:
    env = record["environment"]
    loads = [load for example in record["runs"].values() for stages in example.values()
             for run in stages.values() for load in run["load"]]
    lines = [
        "# Horovod's own TF2 MNIST examples, before and after this project's patches",
        "",
        "Horovod 0.28.1's examples (tag v0.28.1) at -np 2, each in a scratch copy with its "
        "data line changed and the edits listed below, made by `make horovod-examples "
        "HOROVOD_SRC=DIR` (tools/horovod_examples.py), each run with a timeout "
        f"({RUN_TIMEOUT_SECONDS} s) and "
        + " ".join(f"{k}={v}" for k, v in DEFAULT_ENV.items()) + ".",
        "",
        "Before: the installed Horovod's Python with these patches reversed: "
        + ", ".join(record["patches"]) + " (0.28.1's Python as released); after: with them "
        "applied. Both use the same compiled library.",
        "",
        f"- command: `python tools/horovod_examples.py {env['command']}`",
        f"- CPU: {env['cpu']}",
        f"- commit: {env['commit']}, {env['date']}",
        "- stack: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
        f"- load: 1-minute load average {min(loads):.1f} to {max(loads):.1f} on "
        f"{os.cpu_count()} cores at the runs' starts and ends"
        + (" (the machine was shared: other work ran beside these runs, so wall times are "
           "upper bounds)" if max(loads) > 2.5 else ""),
        "",
        "Every example's data line, `" + DATA_LINE + "` (which downloads MNIST), reads the "
        "same arrays from the IDX files `make data` wrote, through "
        "tools/bench/horovod_example.py's `load_data`.",
        "",
    ]
    for name, controllers in record["runs"].items():
        lines += _example_section(name, controllers)
    return "\n".join(lines) + "\n"


def _example_section(name: str, controllers: dict) -> list[str]:
    example = EXAMPLES[name]
    lines = [f"## {example['path']}", "", "Edits beyond the data line:", ""]
    for edit in example["edits"]:
        if edit.new.startswith(edit.old) or edit.new.endswith(edit.old):  # lines added
            added = edit.new.replace(edit.old, "").strip("\n")
            lines += [f"- {edit.why}; added before `{_one_line(edit.old)}`:", "",
                      "  ```python", *(f"  {line}" for line in added.splitlines()), "  ```"]
        else:
            lines.append(f"- `{_one_line(edit.old)}` -> `{_one_line(edit.new) or '(removed)'}`: "
                         f"{edit.why}.")
    first = next(iter(next(iter(controllers.values())).values()))
    lines += ["", f"Command (from the scratch copy's directory): `{first['command']}`", "",
              "| controller | stage | result | wall time | first loss line | last loss line "
              "| weight spread across ranks |", "|---|---|---|---|---|---|---|"]
    for controller, stages in controllers.items():
        for stage in ("before", "after"):
            if stage in stages:
                run = stages[stage]
                lines.append(f"| {controller} | {stage} | {_result(run)} | {run['seconds']} s "
                             f"| {_code(run['first_loss'])} | {_code(run['last_loss'])} "
                             f"| {run.get('weight_spread') or 'none'} |")
    return lines + [""]


def _result(run: dict) -> str:
    if run["returncode"] == 0:
        return f"ran to the end ({run['loss_lines']} loss lines)"
    if run["returncode"] == "timeout":
        return "**timed out**"
    where = f", raised in {run['horovod_frame']}" if run.get("horovod_frame") else ""
    return f"**failed**, exit {run['returncode']}: {_code(run['error'][:160])}{where}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _code(text: str) -> str:
    return f"`{text.replace('|', '/').replace('`', '')}`" if text else "none"
