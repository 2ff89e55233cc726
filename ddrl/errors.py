"""The exceptions that reach users as a one-line message instead of a traceback."""


class DdrlError(Exception):
    """A problem with the user's input or environment, reported as `ddrl: error: <message>`."""


class EveryRankError(DdrlError):
    """One that every rank of a job reaches alike, from the same job file, overrides and world
    size: only the first rank reports it, so the user reads it once, and every rank exits
    without MPI_Abort's banner."""
