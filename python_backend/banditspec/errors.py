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


# A retryable server-side condition (queue full, a wait that expired, a model process
# down or restarting) ends its message with this suffix; the OpenAI front end turns it
# into a 503 with ``Retry-After`` and gRPC clients see it on an UNAVAILABLE error. One
# writer and one reader, so producers and consumers cannot drift apart.
_RETRY_AFTER_PREFIX = "(retry after "
_RETRY_AFTER_SUFFIX = " s)"


def retry_after_message(msg: str, seconds: int) -> str:
    """``msg`` with the retry hint appended; ``seconds`` is clamped to at least 1."""
    return f"{msg.rstrip()} {_RETRY_AFTER_PREFIX}{max(1, int(seconds))}{_RETRY_AFTER_SUFFIX}"


def parse_retry_after(msg: str) -> int | None:
    """The seconds of a message ending in ``(retry after N s)``; None when it has no such suffix."""
    text = msg.rstrip()
    if not text.endswith(_RETRY_AFTER_SUFFIX):
        return None
    start = text.rfind(_RETRY_AFTER_PREFIX)
    if start < 0:
        return None
    number = text[start + len(_RETRY_AFTER_PREFIX): len(text) - len(_RETRY_AFTER_SUFFIX)]
    if not number.isdigit():
        return None
    seconds = int(number)
    return seconds if seconds >= 1 else None
