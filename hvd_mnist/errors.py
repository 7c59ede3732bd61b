"""The exception types that mean "the user gave us something we can't use".

Entry points catch them and print the message as one line with a non-zero
exit, instead of a traceback from deep inside TensorFlow.
"""


class UserFacingError(Exception):
    """A problem with the user's input or environment; the message says what to do."""


class DataError(UserFacingError):
    """The dataset or one of its source files is missing or malformed."""
