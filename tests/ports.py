"""Test helper: take a port as another process would."""

from __future__ import annotations

import socket


def take_port(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A socket listening on ``port`` (SO_REUSEADDR, as tritonserver binds: it still conflicts)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen()
    return s
