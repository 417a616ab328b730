"""Memory of a running engine: its process tree's RSS and USS, sampled over time.

The engine's root process is the launched one (``Endpoint.pid``) or, attached, the process
listening on the endpoint's loopback port (this machine only; an engine elsewhere has no
process here and is sampled through its metrics alone). Children (vLLM's EngineCore and
workers) are included: a leak in any of them counts. USS (memory only this process holds)
needs /proc/<pid>/smaps access; without it only RSS is reported.
"""

from __future__ import annotations

from urllib.parse import urlparse

import psutil

from day0.engines.settings import Endpoint


def engine_root(endpoint: Endpoint) -> psutil.Process | None:
    """The engine's root process on this machine, or None."""
    if endpoint.pid:
        try:
            return psutil.Process(endpoint.pid)
        except psutil.Error:
            return None
    url = urlparse(endpoint.base_url)
    if url.hostname not in ("127.0.0.1", "localhost", "::1") or not url.port:
        return None
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == url.port \
                    and conn.pid:
                return psutil.Process(conn.pid)
    except psutil.Error:
        return None
    return None


def tree_memory(root: psutil.Process) -> tuple[float | None, float | None]:
    """(RSS MiB, USS MiB) summed over root and its descendants; USS None when unreadable."""
    rss = uss = 0.0
    uss_ok = True
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None, None
    for proc in procs:
        try:
            if uss_ok:
                info = proc.memory_full_info()
                rss += info.rss
                uss += info.uss
            else:
                rss += proc.memory_info().rss
        except psutil.AccessDenied:
            uss_ok = False
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                pass
        except psutil.Error:
            pass  # a worker that just exited
    return rss / 2**20, (uss / 2**20 if uss_ok else None)
