"""Errors a user can act on: each message says what was tried and what to do."""


class ModelNotFound(FileNotFoundError):
    """--model names a local path that does not exist."""


class ModelUnavailable(RuntimeError):
    """A model that exists somewhere could not be fetched or read (no network, a corrupt file...)."""
