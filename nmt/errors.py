"""The one exception type for mistakes a user can cause.

The CLI turns an `NmtError` into a single line on stderr and a non-zero exit; anything else
is a bug and keeps its traceback.
"""


class NmtError(Exception):
    """A user-caused error: the message says what is wrong and what to do."""
