"""User-facing errors.

Anything a user can cause (a bad path, an unknown mode, a truncated file) raises
`GearshiftError`; the CLI prints its message on one line and exits with code 2.
Everything else is a bug and keeps its traceback.
"""


class GearshiftError(Exception):
    """A problem with the user's input, reported as one line and exit code 2."""

    exit_code = 2
