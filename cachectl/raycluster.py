"""A Ray cluster for the length of one run: the one way past one machine (``simulate-prefix --ray`` replays trace
partitions on it; ``report --ray`` and ``fix --ray`` render and tokenize a log's prompts on it).

``with ray_cluster(address, jobs=N, origin="--ray") as ray: ...`` connects to ``address`` (``HOST:PORT``,
``ray://HOST:PORT``, ``auto``), or starts a local instance for the run (``None`` or ``local``; with ``jobs`` CPUs
when more than one) and shuts it down after. An address that does not answer is refused in one line within
:data:`RAY_CONNECT_TIMEOUT_S` seconds (Ray itself retries for minutes). :func:`task_error` turns a failed task
back into the cachectl error it raised.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import CachectlError, UsageError

#: seconds to wait for a Ray cluster's address to answer before giving up (Ray itself retries for minutes)
RAY_CONNECT_TIMEOUT_S = 5.0


@contextmanager
def ray_cluster(address: str | None, *, jobs: int = 1, origin: str = "--ray-address") -> Iterator[Any]:
    """The ``ray`` module, initialised as the module docstring says (``origin`` names the option an address came
    from, in an error; ``RAY_ADDRESS`` when none was given)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs ray: pip install 'llm-cachectl[ray]'") from None
    if not address:
        origin, address = "RAY_ADDRESS", os.environ.get("RAY_ADDRESS") or None
    started = False
    if not ray.is_initialized():
        init: dict = dict(logging_level=logging.WARNING, log_to_driver=False)
        if address and address != "local":
            _reachable(address, origin)
            init["address"] = address
        else:
            init.update(num_cpus=jobs if jobs > 1 else None, include_dashboard=False)
        try:
            ray.init(**init)
        except ConnectionError as exc:
            raise UsageError(f"{origin} {address}: cannot connect to a Ray cluster ({_one_line(exc)})") from None
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def task_error(ray: Any, exc: BaseException) -> BaseException:
    """The cachectl error a Ray task raised (a bad input line, a usage error), else ``exc`` itself."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    return cause if isinstance(cause, CachectlError) else exc


def _reachable(address: str, origin: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse, in one line, a Ray address (``HOST:PORT`` or ``ray://HOST:PORT``) that does not accept a TCP
    connection within ``timeout`` seconds. ``auto`` is Ray's to resolve."""
    import socket

    if address == "auto":
        return
    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"{origin} {address}: expected HOST:PORT or ray://HOST:PORT (the cluster's GCS or "
                         "Ray client address), auto or local")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except TimeoutError:
        raise UsageError(f"{origin} {address}: no answer within {timeout:g} s; is the Ray cluster up "
                         "(ray start --head) and the address right?") from None
    except OSError as exc:
        raise UsageError(f"{origin} {address}: cannot reach the Ray cluster ({exc.strerror or exc}); is it up "
                         "(ray start --head) and the address right?") from None


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
