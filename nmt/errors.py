"""The one exception type for mistakes a user can cause.

The CLI turns an `NmtError` into a single line on stderr and a non-zero exit (`exit_code`);
anything else is a bug and keeps its traceback.
"""


class NmtError(Exception):
    """A user-caused error: the message says what is wrong and what to do."""

    exit_code = 1


class Interrupted(NmtError):
    """Ctrl-C (SIGINT) after the command saved what it could; exits 130 as shells expect."""

    exit_code = 130
