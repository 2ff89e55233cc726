"""The one exception type that reaches users as a one-line message instead of a traceback."""


class DdrlError(Exception):
    """A problem with the user's input or environment, reported as `ddrl: error: <message>`."""
