"""The exception types that mean "the user gave us something we can't use".

Entry points catch them and print the message as one line with a non-zero
exit, instead of a traceback from deep inside TensorFlow.
"""

import re


class UserFacingError(Exception):
    """A problem with the user's input or environment; the message says what to do."""


class DataError(UserFacingError):
    """The dataset or one of its source files is missing or malformed."""


class CollectiveError(UserFacingError):
    """An error that every rank raises at the same point of the run.

    It comes from a value every rank holds (rank 0's broadcast outcome, an
    allreduced loss, every rank's gathered outcome), so no rank is left inside a
    collective, and the ranks can wait for each other to print it before any of
    them exits (runtime.leave_together).
    """


def short_reason(error: BaseException) -> str:
    """The first line of an exception's message, without TF's op-wrapper noise."""
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:[^\]]*\]( name:)?", "", str(error))
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__
