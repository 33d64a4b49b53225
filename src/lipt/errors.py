"""The one exception type for mistakes a user can fix (bad config, missing data, bad files).

The entry points turn it into a single line on stderr and exit code 2, with no traceback.
"""


class UserError(ValueError):
    """Bad input from the user: the message says what is wrong and how to fix it."""
