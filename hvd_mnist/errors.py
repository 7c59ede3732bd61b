"""The exception types that mean "the user gave us something we can't use".

Entry points catch them and print the message as one line with a non-zero
exit, instead of a traceback from deep inside TensorFlow.
"""

import re


class UserFacingError(Exception):
    """A problem with the user's input or environment; the message says what to do."""


class DataError(UserFacingError):
    """The dataset or one of its source files is missing or malformed."""


def short_reason(error: BaseException) -> str:
    """The first line of an exception's message, without TF's op-wrapper noise."""
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:[^\]]*\]( name:)?", "", str(error))
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__
