"""Where a run is: whole epochs done, and steps done of the epoch after them.

A checkpoint records its position; `--resume` continues at `first_epoch`,
`first_step`. An epoch checkpoint is (E, 0): epoch E trained and evaluated. A
mid-epoch checkpoint after step s of epoch e is (e - 1, s); s may be the epoch's
last step, whose evaluation then runs after the resume. Steps are counted in one
global batch each, so a position means the same examples at any -np with the
same global batch (splits.py).
"""

import dataclasses


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    epochs_done: int = 0
    steps_done: int = 0  # of epoch epochs_done + 1; 0 at an epoch boundary

    @property
    def first_epoch(self) -> int:
        return self.epochs_done + 1

    @property
    def first_step(self) -> int:
        """The step of `first_epoch` that runs next (steps_per_epoch + 1: none, only its
        evaluation)."""
        return self.steps_done + 1

    @property
    def mid_epoch(self) -> bool:
        return self.steps_done > 0

    def run_steps(self, steps_per_epoch: int) -> int:
        """Steps done since the run began."""
        return self.epochs_done * steps_per_epoch + self.steps_done

    def describe(self, steps_per_epoch: int) -> str:
        if not self.mid_epoch:
            return f"after epoch {self.epochs_done}"
        return (f"after step {self.steps_done} of {steps_per_epoch} of epoch "
                f"{self.first_epoch}")


def after_step(epoch: int, step: int) -> Position:
    """The position once step `step` (from 1) of epoch `epoch` (from 1) is done."""
    return Position(epoch - 1, step)

