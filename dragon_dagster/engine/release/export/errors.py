"""The one error an export raises, whichever part of it finds the problem."""


class ExportError(ValueError):
    """The model or the request cannot be exported; the message names what and why."""
