"""User-facing errors: wrong config, bad data, missing checkpoints.

Entry points print these as one line (``error: ...``) and exit with status 2,
instead of a traceback wall: the message alone must say what to fix.
"""


class UserError(Exception):
    """Base class of errors caused by the user's input rather than by rlflow."""


class DataError(UserError, ValueError):
    """A dataset file is missing or a row is malformed; the message names file, row and field."""


class CheckpointError(UserError, FileNotFoundError):
    """A checkpoint is missing, incomplete, or was written by a different parallel layout."""
