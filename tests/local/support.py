"""Helpers shared by the local stack's tests."""

from __future__ import annotations

import socket


def free_ports(n: int = 4) -> tuple[int, ...]:
    """`n` loopback ports free now (for a sandbox of a test's own)."""
    sockets = [socket.socket() for _ in range(n)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = tuple(sock.getsockname()[1] for sock in sockets)
    for sock in sockets:
        sock.close()
    return ports
