"""Decoding: the per-request session (the paper's Algorithm 3, sans-I/O), the process-wide decoder
that starts sessions, a request's drafter sessions, the costaware controller's rounds, the rewards
and the results a request produces."""
