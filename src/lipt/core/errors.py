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
    """An exception's message on one line (its first), or its type's name; for one a DataLoader
    worker raised, the worker's own message, not torch's "Caught ... in DataLoader worker"."""
    message = str(e)
    message = worker_message(message, type(e)) or message
    text = " ".join(message.split("\n")[0].split())
    return text or type(e).__name__


def worker_message(text: str, kind: type[BaseException]) -> str | None:
    """The message of the exception a worker raised, where torch re-raised it in the main
    process as a `kind` whose message is "Caught <kind> in DataLoader worker process N." and
    the worker's traceback, which ends in `<module>.<kind>: <message>`; else None."""
    if not text.startswith("Caught ") or "\nOriginal Traceback" not in text:
        return None
    prefixes = (f"{kind.__module__}.{kind.__qualname__}: ", f"{kind.__qualname__}: ")
    for line in reversed(text.splitlines()):
        for prefix in prefixes:
            if line.startswith(prefix):
                return line[len(prefix) :]
    return None


def fail(message: str) -> NoReturn:
    """End the process as a user mistake: `error: <message>` on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
