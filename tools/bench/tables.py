"""How the bench writes a report: its JSON, and beside it the Markdown, whose tables round a
figure of 100 or more (images/s, MiB) to a whole number and a smaller one (seconds, ratios)
to 3 significant figures, so no cell claims more precision than run-to-run noise (a few
percent) leaves; a missing figure is a dash."""

import json
import math
import os

MISSING = "–"


def figure(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if abs(float(f"{value:.3g}")) >= 100:
        return f"{value:.0f}"
    return f"{value:#.3g}"


def ratio(value) -> str:
    text = figure(value)
    return text if text == MISSING else text + "×"


def markdown(header: list, rows: list) -> str:
    """A Markdown table; each row a list of cells already formatted."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write(json_path: str, results: dict, markdown_text: str) -> str:
    """results as JSON at json_path, markdown_text beside it (.md) and printed; its path."""
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(results, f, indent=2)
    markdown_path = os.path.splitext(json_path)[0] + ".md"
    with open(markdown_path, "w") as f:
        f.write(markdown_text)
    print(markdown_text)
    return markdown_path
