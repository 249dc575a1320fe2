"""``GET /api/outboxes/{outbox}/export``: the rows matching a filter, streamed as NDJSON or CSV.

The filters are the rows listing's (``error_contains``, ``status_code``,
``created_*``, ``updated_*``, ``delivered_*``, ``attempts_*``,
``payload_column`` + ``payload_contains``), parsed as strictly as the
pages parse them; ``status`` narrows to one status (none: every status).
Every refusal (unknown outbox, bad filter or format, the database away)
is answered before the first byte, because the first batch is read before
the response starts; the rest streams batch by batch
(``outboxkit.operations.export``), so an export of millions of rows holds
one batch in memory.  A database error after the first batch ends the
response early (the client sees an incomplete chunked body), which is logged.

The rows page links here, so a signed-in browser downloads the file
(``Content-Disposition: attachment``).

An export costs the process CPU for every row it encodes, on the threads
that also serve the application's requests, so one admin streams at most
``max_exports`` exports at once: another is refused at once with 429 and
``Retry-After``, before anything is read.  A slot is held from the request
until its stream ends (finished, failed or cut off by the client).
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations at runtime.
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from outboxkit.admin.api import READ_ERRORS, OutboxName, http_errors
from outboxkit.admin.page_inputs import row_filter_from
from outboxkit.admin.route_guard import AdminRoute
from outboxkit.operations.export import EXPORT_FORMATS, ExportFormat
from outboxkit.operations.schemas import Status
from outboxkit.operations.service import OperationsService
from outboxkit.telemetry.log_events import log_fields

__all__ = ["ExportSlots", "export_router"]

logger = logging.getLogger(__name__)

_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The rows, one per line: NDJSON objects, or CSV with a header line.",
        "content": {media_type.split(";")[0]: {} for media_type in EXPORT_FORMATS.values()},
    },
    422: {"description": "A malformed filter, status or format; nothing was read."},
}


RETRY_AFTER_SECONDS = 10
_BUSY: dict[int | str, dict[str, Any]] = {
    429: {"description": "This admin already streams max_exports exports; try again after Retry-After seconds."},
}


class ExportSlots:
    """How many exports one admin streams at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)

    def take(self) -> Callable[[], None] | None:
        """A slot's release (safe to call more than once), or None when every slot is taken."""
        if not self._free.acquire(blocking=False):
            return None
        released = threading.Event()
        lock = threading.Lock()

        def release() -> None:
            with lock:
                if not released.is_set():
                    released.set()
                    self._free.release()

        return release


def export_router(service: OperationsService, *, route_class: type[AdminRoute] = AdminRoute, max_exports: int = 2) -> APIRouter:
    """The export route over ``service``, streaming at most ``max_exports`` exports at once."""
    router = APIRouter(prefix="/api", tags=["outboxkit admin"], route_class=route_class)
    slots = ExportSlots(max_exports)

    @router.get(
        "/outboxes/{outbox}/export",
        name="outboxkit_admin_export",
        response_class=StreamingResponse,
        responses={**READ_ERRORS, **_STREAM, **_BUSY},
        summary="Stream the rows matching a filter as NDJSON or CSV (the rows listing's filters)",
    )
    async def export(
        request: Request,
        outbox: OutboxName,
        format: Annotated[ExportFormat, Query(description="ndjson (one JSON object per line) or csv.")] = "ndjson",
        status: Annotated[Status | None, Query(description="Only this status; every status when left out.")] = None,
    ) -> StreamingResponse:
        release = slots.take()
        if release is None:
            raise HTTPException(
                status_code=429,
                detail=f"this admin already streams {slots.limit} export(s), its max_exports; "
                "try again when one has ended",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        try:
            with http_errors():
                row_filter = row_filter_from(request.query_params.get)
                chunks = service.exports.open(outbox, row_filter=row_filter, status=status, format=format)
                first = await run_in_threadpool(next, chunks, b"")  # refusals and an unreachable database answer here
        except BaseException:
            release()
            raise
        filename = f"{outbox}-{status or 'all'}.{format}"
        return StreamingResponse(
            _logged(itertools.chain([first], chunks), outbox, release),
            media_type=EXPORT_FORMATS[format],
            headers={"Content-Disposition": f'attachment; filename="{_safe_filename(filename)}"'},
        )

    return router


def _logged(chunks: Iterator[bytes], outbox: str, release: Callable[[], None]) -> Iterator[bytes]:
    """``chunks``, with a failure after the response started logged before the connection is cut, and the
    export's slot released however the stream ends (a client that goes away closes the generator)."""
    try:
        yield from chunks
    except Exception as exc:
        logger.error("outboxkit admin: the export of %s failed midway: %s", outbox, exc,
                     extra=log_fields("admin.export_failed", outbox))
        raise
    finally:
        release()


def _safe_filename(name: str) -> str:
    """Only characters that need no quoting in a header (an outbox's job name is the application's)."""
    kept = (symbol if symbol.isascii() and (symbol.isalnum() or symbol in "-_.") else "_" for symbol in name)
    return "".join(kept)
