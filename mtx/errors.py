"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class MtxError(Exception):
    """A problem with the user's input (a file, a line, a config key), explained in one line.

    Line breaks that come from the input itself (a key or a file name holding a newline) are
    shown escaped, so the message stays one line."""

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))
