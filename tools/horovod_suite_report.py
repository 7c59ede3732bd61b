"""reports/horovod_suite.md from tools/horovod_suite.py's results.json: per file, Horovod's
tests passed, failed and skipped before and after the patches; the tests the patches fixed
or broke; and each test still failing, with its cause and the scratch copy's outcome."""

from hvd_mnist.verification.launch import DEFAULT_ENV
from tools import horovod_suite_cases
from tools.horovod_suite import _function_name, counts


def render(record: dict) -> str:
    lines = [
        "# Horovod's own tests, before and after this project's patches",
        "",
        "Horovod 0.28.1's test/parallel files (tag v0.28.1) under "
        "`horovodrun -np 2 -H localhost:2`, each rank running `python -m pytest` "
        "(pytest<8, mock, parameterized) with "
        + " ".join(f"{k}={v}" for k, v in DEFAULT_ENV.items()) + ", made by `make horovod-suite "
        "HOROVOD_SRC=DIR`. A test counts as failed when it failed on either rank.",
        "",
        "Before: the installed Horovod's Python with these patches reversed: "
        + ", ".join(record["patches"]) + " (0.28.1's Python as released); after: with them "
        "applied. Both use the same compiled library.",
        "",
    ]
    for controller, files in record["controllers"].items():
        env = record["environments"][controller]
        if env.get("patches", record["patches"]) != record["patches"]:
            env = {**env, "toggled": env["patches"]}
        lines += _controller_section(controller, files, env)
    return "\n".join(lines) + "\n"


def _environment_lines(env: dict) -> list[str]:
    return [f"- command: `python tools/horovod_suite.py {env['command']}`",
            f"- CPU: {env['cpu']}",
            f"- commit: {env['commit']}, {env['date']}",
            "- stack: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
            *([f"- patches reversed before and applied after in this section: "
               + ", ".join(env["toggled"])] if "toggled" in env else []), ""]


def _cell(result) -> str:
    if result is None:
        return "not run"
    tally = counts(result["results"])
    text = f"{tally['passed']} / {tally['failed']} / {tally['skipped']}"
    if result["timed_out"]:
        text += " (timed out)"
    elif result["ranks_reported"] != result.get("ranks", 2):
        text += f" ({result['ranks_reported']} of {result.get('ranks', 2)} ranks reported)"
    return text


def _controller_section(controller: str, files: dict, env: dict) -> list[str]:
    lines = [f"## {controller.capitalize()}", ""]
    if controller == "integration":
        lines += ["test/integration's files, each under plain `python -m pytest` (no "
                  "horovodrun around it: their tests launch horovodrun themselves, through "
                  "Horovod's own launcher functions); counts are of that one process.", ""]
    lines += [*_environment_lines(env),
             "| file | before: passed / failed / skipped | after | after's wall time |",
             "|---|---|---|---|"]
    for test_file, stages in files.items():
        seconds = f"{stages['after']['seconds']} s" if "after" in stages else ""
        lines.append(f"| {test_file} | {_cell(stages.get('before'))} "
                     f"| {_cell(stages.get('after'))} | {seconds} |")
    if controller == "integration":  # what this machine could not run, and why
        for test_file, stages in files.items():
            reasons = {}
            for outcome, message in stages.get("after", {}).get("results", {}).values():
                if outcome == "skipped":
                    reasons[message] = reasons.get(message, 0) + 1
            lines += [""] + [f"- {test_file}: {n} skipped: {m}" for m, n in reasons.items()]
    fixed, broken, still = [], [], []
    for test_file, stages in files.items():
        before, after = (stages.get(s, {}).get("results", {}) for s in ("before", "after"))
        for test_id, (outcome, message) in sorted(after.items()):
            was = before.get(test_id, ("missing", ""))[0]
            if outcome == "failed":
                (broken if was == "passed" else still).append((test_file, test_id, message))
            elif outcome == "passed" and was == "failed":
                fixed.append((test_file, test_id))
    lines += ["", f"Fixed by the patches ({len(fixed)}): "
              + (", ".join(f"`{t.split('::')[-1]}`" for _, t in fixed) or "none") + ".", ""]
    lines += [f"Passing before, failing after ({len(broken)}): "
              + (", ".join(f"`{t.split('::')[-1]}` ({m})" for _, t, m in broken) or "none")
              + ".", ""]
    lines += [f"### Still failing after the patches ({len(still)})", ""]
    if still:
        lines += ["Each was run again in a scratch copy of its file in which only the test's own "
                  "use of a removed API was changed, inside that test alone "
                  "(tools/horovod_suite_cases.py says what and how).", "",
                  "| test | failure | what the test itself uses | with only that changed |",
                  "|---|---|---|---|"]
    for test_file, test_id, message in still:
        case = (horovod_suite_cases.CASES.get(test_file, {}).get(_function_name(test_id))
                or horovod_suite_cases.SCRIPT_CASES.get(test_file, (None, None))[1])
        scratch = files[test_file]["after"].get("scratch", {}).get(test_id)
        cause = case.cause if case else "**not explained**"
        outcome = "not run" if scratch is None else (
            "passes" if scratch[0] == "passed" else f"{scratch[0]}: {scratch[1]}")
        lines.append(f"| {test_file}::`{test_id.split('::')[-1]}` | {_short(message)} "
                     f"| {cause} | {outcome} |")
    return lines + [""]


def _short(message: str, limit: int = 140) -> str:
    message = message.replace("|", "\\|")
    return message if len(message) <= limit else message[:limit - 3] + "..."
