"""The base of every error draftsmith raises for bad input: the CLI prints its message as one line."""


class DraftsmithError(ValueError):
    """Bad input the user can fix; the message names what is wrong and what to do."""
