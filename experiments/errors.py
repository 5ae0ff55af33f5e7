"""The one exception type for mistakes a user can make, and the CLI wrapper that reports it."""

import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input from a user (file, text, config, checkpoint): one-line report, exit status 2."""


def run_cli(main: Callable[[], object]) -> None:
    """Runs `main`; a UserError, an OSError or Ctrl-C becomes one line and a non-zero exit."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # a read-only or full disk: the machine's state, not a bug to trace
        where = f": {e.filename}" if e.filename else ""
        print(f"error: {e.strerror or e}{where}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
