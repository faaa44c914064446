"""The one error a caller gets for bad input."""


class BanditSpecValidationError(ValueError):
    """Bad input to the library or the server.

    ``field`` names the offending input (``text_input``, ``max_tokens``,
    ``policy``, ``arms``, ``max_draft_len`` ...); the message always starts
    with it, so a client can tell what to fix without a traceback.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class DrafterError(RuntimeError):
    """A drafter failed (raised or exceeded its per-step deadline)."""


class EngineError(RuntimeError):
    """The target engine failed or is unavailable."""
