"""The listening TCP sockets of a Ray session's processes, and whether an address is loopback (for the loopback tests).

A session's processes are this process, its descendants (a driver started as a subprocess, and everything
it starts), and any process whose command line names the session folder (Ray's agents).
"""

from __future__ import annotations

import ipaddress

import psutil


def is_loopback(ip: str) -> bool:
    """Whether a listening address is loopback (an IPv4-mapped IPv6 one included; ``0.0.0.0`` and ``::`` are not)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def session_processes(temp_dir: str) -> list[psutil.Process]:
    me = psutil.Process()
    procs = {p.pid: p for p in [me, *me.children(recursive=True)]}
    for p in psutil.process_iter(["cmdline"]):
        if any(temp_dir in arg for arg in p.info["cmdline"] or []):
            procs.setdefault(p.pid, p)
    return list(procs.values())


def listeners(procs: list[psutil.Process]) -> list[dict]:
    """``{pid, name, ip, port}`` of every listening TCP socket of ``procs``."""
    found = []
    for p in procs:
        try:
            name = p.name()
            conns = p.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [{"pid": p.pid, "name": name, "ip": c.laddr.ip, "port": c.laddr.port}
                  for c in conns if c.status == psutil.CONN_LISTEN]
    return found
