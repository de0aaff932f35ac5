"""The engine's exception tree. The gateway maps each class to one HTTP status."""


class EngineError(Exception):
    """Base class for every error the engine reports to its caller."""


class InvalidRequestError(EngineError, ValueError):
    """The request itself is wrong (bad sampling value, unknown token id...). HTTP 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """Prompt (plus max_tokens) does not fit the model's context window. HTTP 400."""


class QueueFullError(EngineError):
    """The waiting queue is full; retry later. HTTP 429."""


class EngineDeadError(EngineError):
    """The engine loop died; nothing more can be served. HTTP 503."""


class ModelLoadError(EngineError, ValueError):
    """The model cannot be served: a missing or corrupt file, an architecture or format the engine does not run. The
    message is one line naming what was found and what is supported; startup stops with it (python -m gateway)."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """No model at the configured path."""
