"""The one error data code raises, in a module of its own so that the table and conversation modules share it."""

from __future__ import annotations


class DataError(ValueError):
    """The data cannot be used as asked: unreadable file, missing column, empty dataset, bad template."""
