"""How a request ended: what the serving controller reports to ``on_request_done`` and
the ``outcome`` label values of the requests metric."""

OUTCOME_SUCCESS = "success"
OUTCOME_CANCELLED = "cancelled"
OUTCOME_INVALID = "invalid"
OUTCOME_BUSY = "busy"
OUTCOME_TARGET_ERROR = "target_error"
OUTCOME_INTERNAL = "internal"
OUTCOMES = (OUTCOME_SUCCESS, OUTCOME_CANCELLED, OUTCOME_INVALID, OUTCOME_BUSY, OUTCOME_TARGET_ERROR, OUTCOME_INTERNAL)
