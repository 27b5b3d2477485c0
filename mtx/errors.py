"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class MtxError(Exception):
    """A problem with the user's input (a file, a line, a config key), explained in one line."""
