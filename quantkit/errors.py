"""User-facing errors.

A :class:`QuantkitError` is a problem with the user's input (a path, an option, a file). The CLI prints its
message as one line and exits with code 2, no traceback. Anything else is a bug and keeps its traceback.
"""


class QuantkitError(Exception):
    """An error the user can fix; the message names the problem and the fix in one line."""

    exit_code = 2
