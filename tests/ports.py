"""A free loopback port for a server a test starts, chosen where no other socket will be given it meanwhile.

Binding port 0 and handing the number on leaves a window before the server binds it, and in it the kernel may
give the same number to any other socket of the machine: Linux draws the local ports of outgoing connections
and of bind(0) from ``net.ipv4.ip_local_port_range`` (32768–60999 here), and three pytest workers, kubectl,
Prometheus and the control plane open connections all the time (a clean-clone CI run lost a test to
"address already in use" that way). So a port is drawn at random below that range, where the kernel never
hands one out on its own, and checked by binding it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_random = random.Random()  # NB: seeded from the OS: each pytest worker draws differently


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port nothing listens on, outside the kernel's ephemeral range when there is room."""
    low = _ephemeral_low()
    if low > 12000:
        for _ in range(200):
            port = _random.randrange(low - 10000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
