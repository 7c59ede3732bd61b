"""What steady state means for every images/s figure of the bench, in one place. The
trainers count images/s over windows of WINDOW_STEPS steps (hvd_mnist/outputs/timing.py).
The first window holds tracing and warm-up, so a run's rate is the median of the windows
after it (a smoke run of one window keeps it). A program that records when each step ended
(Horovod's example) is cut into the same windows. A run too short for windows (make
scaling: 40 steps) is timed from its first step's end to its last's. Repeated runs: the
median of each figure."""

import math
import statistics

from hvd_mnist.outputs.timing import WINDOW_STEPS


def images_per_second(window_rates) -> float:
    """The median of the windows after the first; NaN for a run without one."""
    rates = list(window_rates)
    steady = rates[1:] if len(rates) > 1 else rates
    return statistics.median(steady) if steady else math.nan


def windows_from_step_times(step_unix_times, images_per_step: int,
                            window_steps: int = WINDOW_STEPS) -> list:
    """Images/s over consecutive windows of window_steps steps, each from the end of the
    step before it to the end of its last (n + 1 times make a window of n steps)."""
    return [window_steps * images_per_step / (step_unix_times[i + window_steps]
                                              - step_unix_times[i])
            for i in range(0, len(step_unix_times) - window_steps, window_steps)]


def seconds_per_step_after_first(first_step_unix_time: float, last_step_unix_time: float,
                                 steps: int) -> float:
    """Steps 2..N: the first step's end to the last's, over the steps between them."""
    return (last_step_unix_time - first_step_unix_time) / (steps - 1)


def median_of_runs(runs: list) -> dict:
    """Each numeric figure's median over repeated runs; text, lists and flags are left out."""
    return {key: statistics.median(run[key] for run in runs) for key, value in runs[0].items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def ratios(numerators: dict, denominators: dict) -> dict:
    """numerator / denominator of every number both hold."""
    return {key: numerators[key] / denominators[key] for key in denominators
            if key in numerators and isinstance(denominators[key], (int, float))
            and not isinstance(denominators[key], bool) and denominators[key]}
