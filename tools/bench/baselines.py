"""An earlier run's ratios, read from its committed report, for make bench to set today's
beside.

Only a ratio measured within one run can travel between runs: hvd_mnist over Horovod's
example, the custom loop over Keras fit or plain TF. Absolute figures cannot (the same
CPU model runs about 2x faster with AVX-512 than AVX2-only, and load changes them too).
Today's ratio over the baseline's says how hvd_mnist moved against a yardstick that
stayed the same (the example is the same program in both runs), without building and
running an old revision again. The baseline is the report as it stands when the bench
starts (the committed one in a clean checkout), read before the run overwrites it.
"""

import json
import os

from tools.bench import steady_state


def load(path: str):
    """The report at path; None where there is none (a first run)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench: error: cannot read the baseline {path} ({e})") from None
    if not isinstance(report, dict):
        raise SystemExit(f"bench: error: the baseline {path} is not a make bench report")
    return report


def provenance(report: dict, path: str) -> dict:
    """Which report the baseline is: its path, date and machine."""
    return {"report": path, "date": report.get("date", "?"),
            "machine": report.get("machine", "?")}


def versus_example_ratios(report: dict) -> dict:
    """{"np2": {figure: hvd_mnist / example}, ...} as the report's part 5 measured them."""
    return {np_key: result["hvd_mnist_over_example"]
            for np_key, result in report.get("versus_example", {}).items()
            if "hvd_mnist_over_example" in result}


def changes(today: dict, baseline: dict) -> dict:
    """Today's ratio over the baseline's, for each ratio both hold; nested one level where
    the ratios are grouped (by -np)."""
    out = {}
    for key, value in today.items():
        if isinstance(value, dict):
            if isinstance(baseline.get(key), dict):
                out[key] = steady_state.ratios(value, baseline[key])
        elif key in baseline:
            out.update(steady_state.ratios({key: value}, {key: baseline[key]}))
    return out
