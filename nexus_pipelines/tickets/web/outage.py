"""The pages while the control plane is unreachable: every request answers one line with 503,
and the server logs one line when an outage begins and one when it ends (never a traceback
per request)."""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg_pool import PoolTimeout
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from nexus_pipelines.redaction import describe_exception

log = logging.getLogger("nexus_pipelines.tickets.web")

UNREACHABLE = (psycopg.OperationalError, PoolTimeout)
MESSAGE = ("The control plane (Postgres) is unreachable, so the ticket pages cannot be read now: "
           "start it with `make up`, then reload this page.")
RETRY_AFTER_S = 10


class ControlPlaneDown(Exception):
    """A page's read or command could not reach the control plane."""


CONNECT_WAIT_S = 5.0  # how long a request waits for a control-plane connection
OUTAGE_WAIT_S = 1.0  # ... while an outage is known: the answer is most likely 503 again, so be quick


class OutageWatch:
    """Remembers whether the control plane is down, so each outage is logged once."""

    def __init__(self) -> None:
        self._down = False
        self._lock = threading.Lock()

    def connect_wait_s(self) -> float:
        return OUTAGE_WAIT_S if self._down else CONNECT_WAIT_S

    def failed(self, exc: BaseException) -> ControlPlaneDown:
        with self._lock:
            began, self._down = not self._down, True
        if began:
            log.warning("control plane unreachable (%s); the pages answer 503 until it is back",
                        describe_exception(exc, 300))
        return ControlPlaneDown()

    def reached(self) -> None:
        if not self._down:  # the common case, without the lock
            return
        with self._lock:
            ended, self._down = self._down, False
        if ended:
            log.warning("control plane reachable again; the pages answer as usual")


def unreachable_answer(headers: dict[str, str]):
    async def answer(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(MESSAGE, status_code=503, headers={**headers, "Retry-After": str(RETRY_AFTER_S)})
    return answer
