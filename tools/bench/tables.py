"""How the bench's Markdown tables round: a figure of 100 or more (images/s, MiB) as a
whole number, a smaller one (seconds, ratios) to 3 significant figures, so no cell
claims more precision than run-to-run noise (a few percent) leaves; a missing figure
as a dash."""

import math

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

