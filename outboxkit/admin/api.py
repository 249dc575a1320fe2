"""The admin's JSON API (documented in the application's OpenAPI schema).

Routes, relative to where the application mounts the router::

    GET  /api/outboxes                              counts, heartbeat and leader per outbox
    GET  /api/outboxes/{outbox}/rows                one status, keyset-paginated both ways, filterable
    GET  /api/search?q=                             a row by id or idempotency key, in every outbox
    GET  /api/outboxes/{outbox}/rows/{row_id}       one row with its payload
    POST /api/outboxes/{outbox}/reset               {"ids": [...]}: stuck -> pending
    POST /api/outboxes/{outbox}/retry-now           {"ids": [...]}: pending in backoff -> due now
    GET  /api/outboxes/{outbox}/blocked-keys        an ordered outbox's stuck heads and the rows waiting behind each
    POST /api/outboxes/{outbox}/skip                {"ids": [...]}: stuck heads of ordered keys skipped (they stay stuck)
    POST /api/outboxes/{outbox}/reset-matching      {"error_contains", "status_code", "dry_run"}
    POST /api/outboxes/{outbox}/discard             {"ids": [...]}: stuck -> discarded (kept, never sent; reset undoes it)
    POST /api/outboxes/{outbox}/discard-matching    {"error_contains", "status_code", "dry_run"}
    POST /api/outboxes/{outbox}/pause               {}: no process claims its rows until resumed
    POST /api/outboxes/{outbox}/resume              {}: the drains claim again (woken at once)
    POST /api/outboxes/{outbox}/drain-now           {}: wake every drain of the outbox (409 while paused)
    POST /api/outboxes/{outbox}/replay              {filter..., "dry_run", "batch_size"}: done -> pending, in batches
    GET  /api/outboxes/{outbox}/export              the rows matching a filter as NDJSON or CSV (outboxkit.admin.export_route)
    GET  /api/audit                                 the reset audit, newest first
    GET  /api/jobs                                  deprecated: GET /api/schedules (internal_jobs) or /api/schedules/_internal
    GET  /api/jobs/{job_id}/runs                    deprecated: GET /api/schedules/_internal/{job_id}/runs

Errors: 404 unknown outbox or row, 409 a row a drain holds (nothing
changed), 400 a cursor or body that does not decode, 413 a body over the cap,
415 a POST that is not JSON, 422 anything else malformed (ids out of range or
not JSON integers, ``dry_run`` not a JSON boolean, page size outside 1..200, a
filter with NUL characters, more than 500 ids), 503 the database is
unreachable, the request ran past the admin's time limit ("narrow the
filter") or found the admin's own connections busy.  Page sizes are refused, not clamped.

A POST body is read by the endpoint itself, after the auth dependency has
admitted the request (FastAPI reads a declared body parameter before any
dependency runs), and never beyond the cap (see ``outboxkit.admin.route_guard``).
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from outboxkit.admin.refusals import REFUSALS, refusal_headers, refusal_status
from outboxkit.admin.route_guard import AdminRoute, read_json_body
from outboxkit.errors import InvalidSearch, NotOrderedError
from outboxkit.operations.ordered_keys import BlockedKeys
from outboxkit.operations.replay import ReplayOutcome, ReplayRequest
from outboxkit.operations.schemas import (
    MAX_ROW_ID,
    ActionResult,
    AuditPage,
    ChartWindow,
    ControlResult,
    EmptyRequest,
    FilterMoment,
    FilterText,
    FoundRow,
    IdsRequest,
    JobRunsView,
    JobsView,
    MatchOutcome,
    MatchRequest,
    Overview,
    RowDetailModel,
    RowFilter,
    RowPage,
    Status,
)
from outboxkit.operations.service import OperationsService

__all__ = ["MAX_PAGE_SIZE", "api_router", "http_errors"]

MAX_PAGE_SIZE = 200


class ErrorBody(BaseModel):
    detail: str


_NOT_FOUND: dict[str, Any] = {"model": ErrorBody, "description": "Unknown outbox or row."}
_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {
        "model": ErrorBody,
        "description": "The database is unreachable, the request ran past the admin's time limit (narrow the filter) "
        "or the admin's connections stayed busy; nothing was changed.",
    }
}
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The cursor does not decode."},
    404: _NOT_FOUND,
}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body does not parse (for example, it is not UTF-8)."},
    404: _NOT_FOUND,
    409: {"model": ErrorBody, "description": "A drain holds a listed row; nothing was changed."},
    413: {"model": ErrorBody, "description": "The body is larger than OUTBOXKIT_ADMIN_MAX_BODY_BYTES; nothing was changed."},
    415: {"model": ErrorBody, "description": "The body is not application/json."},
}


@contextmanager
def http_errors() -> Iterator[None]:
    """Turn the service's refusals into HTTP answers."""
    try:
        yield
    except REFUSALS as exc:
        status_code = refusal_status(exc)
        if status_code == 422:  # shaped as FastAPI's own 422 (the documented HTTPValidationError)
            where = ("path", "outbox") if isinstance(exc, NotOrderedError) else (
                "query", "q" if isinstance(exc, InvalidSearch) else "payload_column"
            )
            problem = {"type": "value_error", "loc": where, "msg": str(exc), "input": None}
            raise RequestValidationError([problem]) from None
        raise HTTPException(status_code=status_code, detail=str(exc), headers=refusal_headers(exc)) from None


def require_json(request: Request) -> None:
    """Only JSON bodies: a cross-site form or no-CORS fetch cannot send them, which is the API's CSRF guard."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise HTTPException(status_code=415, detail="send the body as application/json")


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of an endpoint that reads ``model`` itself (after auth, capped).

    The schema is written inline in the operation: FastAPI's component models
    store numeric bounds as floats, which would publish the id maximum
    2^63-1 as 9.223372036854776e+18.
    """
    schema = model.model_json_schema()
    assert "$defs" not in schema, f"{model.__name__} must not need $defs to be inlined"
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


OutboxName = Annotated[str, Path(description="The outbox's job_name.", max_length=100)]
RowIdPath = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="The row id.")]
_HEX = "[0-9A-Fa-f]"
SEARCH_PATTERN = f"^([0-9]{{1,19}}|{_HEX}{{8}}-?{_HEX}{{4}}-?{_HEX}{{4}}-?{_HEX}{{4}}-?{_HEX}{{12}})$"
JobIdPath = Annotated[str, Path(description="The job's id, e.g. outboxkit.drain.webhooks.", max_length=200)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description=f"Page size, 1 to {MAX_PAGE_SIZE} (refused, not clamped).")]
Cursor = Annotated[str | None, Query(max_length=512, description="next_cursor from the previous page.")]


def api_router(service: OperationsService, *, actor: Callable[..., str], route_class: type[AdminRoute] = AdminRoute) -> APIRouter:
    """The JSON routes over ``service``; ``actor`` is a dependency naming who acts."""
    router = APIRouter(prefix="/api", tags=["outboxkit admin"], route_class=route_class, responses=_UNAVAILABLE)
    Actor = Annotated[str, Depends(actor)]

    @router.get("/outboxes", response_model=Overview, summary="Every outbox: counts, oldest due row, last drain run; the leader")
    def overview(
        charts: Annotated[
            bool, Query(description="Add each outbox's chart figures (chart; for window=1h also last_hour), as drawn.")
        ] = False,
        window: Annotated[
            ChartWindow, Query(description="The charts' window: 1h (per minute), 24h (per 15 min), 7d (per 2 h).")
        ] = "1h",
    ) -> Overview:
        return service.overview(charts=charts, window=window)

    @router.get(
        "/outboxes/{outbox}/rows", response_model=RowPage, responses=READ_ERRORS, summary="Rows of one outbox in one status"
    )
    def rows(
        outbox: OutboxName,
        status: Annotated[Status, Query(description="pending rows come due-first; stuck and done newest first")] = "stuck",
        error_contains: Annotated[FilterText, Query()] = None,
        status_code: Annotated[int | None, Query(ge=100, le=599, description="Exact last HTTP status code.")] = None,
        created_after: Annotated[FilterMoment, Query(description="created_at at or after (ISO 8601, not a number).")] = None,
        created_before: Annotated[FilterMoment, Query(description="created_at before (ISO 8601, not a number).")] = None,
        updated_after: Annotated[FilterMoment, Query(description="updated_at at or after (ISO 8601, not a number).")] = None,
        updated_before: Annotated[FilterMoment, Query(description="updated_at before (ISO 8601, not a number).")] = None,
        delivered_after: Annotated[FilterMoment, Query(description="delivered_at at or after (ISO 8601, not a number).")] = None,
        delivered_before: Annotated[FilterMoment, Query(description="delivered_at before (ISO 8601, not a number).")] = None,
        attempts_min: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
        attempts_max: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
        payload_column: Annotated[str | None, Query(max_length=63, description="One of the outbox's own columns.")] = None,
        payload_contains: Annotated[
            FilterText, Query(description="Case-insensitive substring of payload_column as text.")
        ] = None,
        due_at: Annotated[
            FilterMoment, Query(description="Exactly this next_attempt_at (a destination's waiting_until: the rows it holds).")
        ] = None,
        counts: Annotated[bool, Query(description="Also count each status under the same filter.")] = False,
        cursor: Cursor = None,
        limit: Limit = 50,
    ) -> RowPage:
        with http_errors():
            row_filter = RowFilter(
                error_contains=error_contains,
                status_code=status_code,
                created_after=created_after,
                created_before=created_before,
                updated_after=updated_after,
                updated_before=updated_before,
                delivered_after=delivered_after,
                delivered_before=delivered_before,
                attempts_min=attempts_min,
                attempts_max=attempts_max,
                payload_column=payload_column,
                payload_contains=payload_contains,
                due_at=due_at,
            )
            return service.rows(outbox, status=status, row_filter=row_filter, cursor=cursor, limit=limit, with_counts=counts)

    @router.get(
        "/search", response_model=list[FoundRow], responses={404: _NOT_FOUND}, summary="Find a row by id or idempotency key"
    )
    def search(
        q: Annotated[str, Query(pattern=SEARCH_PATTERN, description="A row id or an idempotency key (UUID).")],
        outbox: Annotated[str | None, Query(max_length=100, description="Only this outbox.")] = None,
    ) -> list[FoundRow]:
        with http_errors():
            return service.find(q, outbox_name=outbox)

    @router.get("/outboxes/{outbox}/rows/{row_id}", response_model=RowDetailModel, responses={404: _NOT_FOUND}, summary="One row")
    def row(outbox: OutboxName, row_id: RowIdPath) -> RowDetailModel:
        with http_errors():
            return service.row(outbox, row_id)

    def outbox_action(
        action: str, summary: str, request_model: type[BaseModel], response_model: type[BaseModel],
        perform: Callable[[str, Any, str], BaseModel],
    ) -> None:
        """``POST /outboxes/{outbox}/<action>``: a JSON body of ``request_model``, run as ``perform(outbox, body, actor)``."""

        async def act(request: Request, outbox: OutboxName, who: Actor) -> Any:
            body = await read_json_body(request, request_model)
            with http_errors():
                return await run_in_threadpool(perform, outbox, body, who)

        router.add_api_route(
            f"/outboxes/{{outbox}}/{action.replace('_', '-')}",
            act,
            methods=["POST"],
            response_model=response_model,
            responses=WRITE_ERRORS,
            dependencies=[Depends(require_json)],
            summary=summary,
            name=f"outboxkit_admin_api_{action}",
            openapi_extra=json_body(request_model),
        )

    def id_action(action: str, summary: str, perform: Callable[..., ActionResult]) -> None:
        outbox_action(action, summary, IdsRequest, ActionResult, lambda outbox, body, who: perform(outbox, body.ids, actor=who))

    id_action("reset", "Reset stuck rows by id (one or many): pending, attempts 0, due now", service.reset)
    id_action("retry_now", "Make pending rows in backoff due now (attempts kept)", service.retry_now)
    id_action(
        "discard",
        "Discard stuck rows by id: kept with the status discarded, never sent, out of the stuck count; a reset undoes it",
        service.discard,
    )
    outbox_action(
        "discard_matching",
        "Discard every stuck row matching a filter (dry_run defaults to true)",
        MatchRequest,
        MatchOutcome,
        lambda outbox, body, who: service.reset_matching(
            outbox,
            RowFilter(error_contains=body.error_contains, status_code=body.status_code),
            dry_run=body.dry_run,
            actor=who,
            discard=True,
        ),
    )
    id_action(
        "skip",
        "Skip stuck rows in their ordering key's order: they stay stuck, never deleted; the rows behind them flow",
        service.skip,
    )

    @router.get(
        "/outboxes/{outbox}/blocked-keys",
        response_model=BlockedKeys,
        responses={404: _NOT_FOUND},
        summary="An ordered outbox's stuck heads: each blocks its key; the rows waiting behind each (422: no ordering key)",
    )
    def blocked_keys(outbox: OutboxName) -> BlockedKeys:
        with http_errors():
            return service.ordered_keys.blocked_keys(outbox)

    @router.post(
        "/outboxes/{outbox}/reset-matching",
        response_model=MatchOutcome,
        responses=WRITE_ERRORS,
        dependencies=[Depends(require_json)],
        summary="Reset every stuck row matching a filter (dry_run defaults to true)",
        openapi_extra=json_body(MatchRequest),
    )
    async def reset_matching(request: Request, outbox: OutboxName, who: Actor) -> MatchOutcome:
        body: MatchRequest = await read_json_body(request, MatchRequest)
        row_filter = RowFilter(error_contains=body.error_contains, status_code=body.status_code)
        with http_errors():
            return await run_in_threadpool(service.reset_matching, outbox, row_filter, dry_run=body.dry_run, actor=who)

    outbox_action(
        "replay",
        "Send delivered rows matching a filter again, in batches (dry_run defaults to true)",
        ReplayRequest,
        ReplayOutcome,
        lambda outbox, body, who: service.replays.replay(
            outbox, body.row_filter(), actor=who, dry_run=body.dry_run, batch_size=body.batch_size
        ),
    )

    def control(action: str, summary: str, perform: Callable[..., ControlResult]) -> None:
        outbox_action(action, summary, EmptyRequest, ControlResult, lambda outbox, body, who: perform(outbox, actor=who))

    controls = service.controls
    control("pause", "Pause the outbox's drains in every process (rows stay pending; in-flight rows finish)", controls.pause)
    control("resume", "Resume the outbox's drains (woken at once)", controls.resume)
    control("drain_now", "Wake every drain of the outbox now (409 while paused)", controls.drain_now)

    @router.get("/audit", response_model=AuditPage, responses=READ_ERRORS, summary="Reset audit, newest first")
    def audit(
        outbox: Annotated[str | None, Query(max_length=100, description="Only this outbox.")] = None,
        cursor: Cursor = None,
        limit: Limit = 50,
    ) -> AuditPage:
        with http_errors():
            return service.audit(outbox_name=outbox, cursor=cursor, limit=limit)

    # Deprecated, still answering: one scheduling concept, so the elected jobs are listed with the schedules.
    @router.get(
        "/jobs",
        response_model=JobsView,
        deprecated=True,
        summary="Deprecated: use GET /api/schedules/_internal (or internal_jobs in GET /api/schedules)",
        description="Jobs: schedule in words, last run, failures, pause; the leader.  Deprecated: the jobs the elected "
        "leader runs are listed, read-only and marked internal, by GET /api/schedules/_internal and in every page of "
        "GET /api/schedules (internal_jobs); an application's own jobs are schedules (kit.schedules.add_job).",
    )
    def jobs() -> JobsView:
        return service.jobs()

    @router.get(
        "/jobs/{job_id:path}/runs",
        response_model=JobRunsView,
        responses={404: _NOT_FOUND},
        deprecated=True,
        summary="Deprecated: use GET /api/schedules/_internal/{job_id}/runs (or /api/schedules/{name}/history)",
        description="One job's runs, newest first.  Deprecated: an internal job's runs are at "
        "GET /api/schedules/_internal/{job_id}/runs, a schedule's at GET /api/schedules/{name}/history.",
    )
    def job_runs(job_id: JobIdPath, limit: Limit = 50) -> JobRunsView:
        with http_errors():
            return service.job_runs(job_id, limit=limit)

    return router
