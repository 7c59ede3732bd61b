"""Wall-clock timing of training steps, shared by the custom loop and Keras fit.

Throughput is recorded over windows of WINDOW_STEPS steps within an epoch, so
a benchmark can drop the first window (tracing, warm-up) and take the median
of the rest instead of trusting one number that includes start-up costs.
"""

import resource
import time

WINDOW_STEPS = 20


def images_per_second(images, seconds: float) -> float:
    """The one way every figure of images/s is computed; 0.0 before any time has passed."""
    return images / seconds if seconds > 0 else 0.0


class StepClock:

    def __init__(self, images_per_step: int, window_steps: int = WINDOW_STEPS):
        self.images_per_step = images_per_step
        self.window_steps = window_steps
        self.window_images_per_second = []
        self.first_step_unix_time = None
        self.last_step_unix_time = None

    def epoch_started(self) -> None:
        self._window_start = time.perf_counter()
        self._steps_in_window = 0

    def step_done(self) -> None:
        self.last_step_unix_time = time.time()
        if self.first_step_unix_time is None:
            self.first_step_unix_time = self.last_step_unix_time
        self._steps_in_window += 1
        if self._steps_in_window == self.window_steps:
            now = time.perf_counter()
            self.window_images_per_second.append(images_per_second(
                self.window_steps * self.images_per_step, now - self._window_start))
            self._window_start, self._steps_in_window = now, 0

    def to_dict(self) -> dict:
        return {"window_steps": self.window_steps,
                "window_images_per_second": self.window_images_per_second,
                "first_step_unix_time": self.first_step_unix_time,
                "last_step_unix_time": self.last_step_unix_time}


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
