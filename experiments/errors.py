"""The one error a user is meant to see: bad input, reported in one line by the commands."""


class UserError(Exception):
    """Bad input from a user (file, text, config, checkpoint): one-line report, exit status 2."""
