"""The one user-error type of the command line (a leaf module: importable from anywhere)."""


class CliError(Exception):
    """A user error: printed as ``engine-advisor: error: ...`` with exit status 2."""
