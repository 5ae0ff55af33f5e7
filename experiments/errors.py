"""The one exception type for mistakes a user can make, and the CLI wrapper that reports it."""

import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input from a user (file, text, config, checkpoint): one-line report, exit status 2."""


def run_cli(main: Callable[[], object]) -> None:
    """Runs `main`, turning a UserError or Ctrl-C into a one-line message and a non-zero exit."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
