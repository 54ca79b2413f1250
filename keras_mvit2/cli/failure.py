"""`CommandFailedError`: a sub-command's own failure with its exit status, printed by `main`."""


class CommandFailedError(Exception):
    """Raised by a sub-command handler whose work ended in a reported failure (not bad
    input): `main` prints ``mvit2 COMMAND: error: MESSAGE`` and exits with `status`."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status
