"""The one exception type for mistakes a user can fix (bad config, missing data, bad files).

The entry points turn it into a single line on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import sys
from typing import NoReturn

EXIT_USER_ERROR = 2


class UserError(ValueError):
    """Bad input from the user: the message says what is wrong and how to fix it."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (its first), or its type's name."""
    text = " ".join(str(e).split("\n")[0].split())
    return text or type(e).__name__


def fail(message: str) -> NoReturn:
    """End the process as a user mistake: `error: <message>` on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
