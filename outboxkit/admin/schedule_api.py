"""The schedules' JSON API (in the application's OpenAPI schema beside ``outboxkit.admin.api``).

Routes, relative to where the application mounts the router::

    GET  /api/schedules?viewer_timezone=&cursor=&limit= schedules by name, a page at a time: next five fire times
                                                        (its zone and the viewer's), last run
    GET  /api/schedules/_internal                       the jobs the elected leader runs, read-only, marked internal
                                                        (also in every page of the list, as internal_jobs)
    GET  /api/schedules/_internal/{job_id}/runs         one of them's runs, newest first (job ids may hold '/')
    GET  /api/schedules/{name}?viewer_timezone=         one schedule
    GET  /api/schedules/{name}/history                  runs, misses, abandoned runs, newest first (outcome=, before=, limit=)
    GET  /api/schedules/{name}/audit                    who changed it, when, before and after (newest first)
    POST /api/schedules/new                             {name, trigger, target, ...}: create
    POST /api/schedules/{name}/edit                     {trigger, target, ...}: replace its definition
    POST /api/schedules/{name}/enable                   {}
    POST /api/schedules/{name}/disable                  {}
    POST /api/schedules/{name}/run-now                  {}: one occurrence at this instant
    POST /api/schedules/{name}/delete                   {}: its history and audit stay

Every POST takes ``application/json`` only (the API's CSRF guard, as in
``outboxkit.admin.api``), runs through ``outboxkit.operations.schedule_admin``
and is audited with the actor.  Errors: 404 an unknown schedule, 422 a
definition the schedule rules refuse, with the field at fault as the error's
``loc`` (``["body", "trigger", "timezone"]``, ``["body", "target", "url"]``,
``["body", "name"]`` for a taken name), shaped as FastAPI's own 422; nothing
is written; 404 an internal job id no elected job has; 400 a list cursor that does not decode, 422 a page size outside
1..200 (refused, not clamped, as the rows' list).  503 as for every admin route.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from outboxkit.admin.api import MAX_PAGE_SIZE, Cursor, ErrorBody, JobIdPath, Limit, http_errors, require_json
from outboxkit.admin.route_guard import AdminRoute, read_json_body
from outboxkit.errors import InvalidScheduleError, InvalidValueError
from outboxkit.operations.schedule_admin import DEFAULT_LIST_PAGE, ScheduleAdmin
from outboxkit.operations.schedule_schemas import (
    SCHEDULE_NAME_PATTERN,
    InternalJobsView,
    ScheduleActionResult,
    ScheduleAuditEntry,
    ScheduleCreate,
    ScheduleFields,
    ScheduleHistoryPage,
    ScheduleListView,
    ScheduleModel,
)
from outboxkit.operations.schemas import EmptyRequest, FilterMoment, JobRunsView

__all__ = ["inline_schema", "schedule_api_router", "schedule_errors"]

ScheduleName = Annotated[str, Path(description="The schedule's name.", max_length=200, pattern=SCHEDULE_NAME_PATTERN)]
ViewerTimezone = Annotated[
    str, Query(max_length=64, description="The viewer's IANA timezone for each fire time's viewer field (default UTC).")
]
_NOT_FOUND: dict[str, Any] = {"model": ErrorBody, "description": "No schedule has this name."}
# FastAPI documents its 422 only for routes with parameters it validates; the create route has none.
_REFUSED: dict[str, Any] = {
    "description": "The body does not fit the schema, or a schedule rule refuses a field (loc names it); nothing was written.",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
}
_WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body does not parse (for example, it is not UTF-8)."},
    404: _NOT_FOUND,
    413: {"model": ErrorBody, "description": "The body is larger than OUTBOXKIT_ADMIN_MAX_BODY_BYTES; nothing was changed."},
    415: {"model": ErrorBody, "description": "The body is not application/json."},
}


@contextmanager
def schedule_errors(query_field: str = "viewer_timezone") -> Iterator[None]:
    """A refused definition as FastAPI's 422 with the field as its ``loc``; other refusals as ``http_errors``."""
    with http_errors():
        try:
            yield
        except InvalidScheduleError as exc:
            problem = {"type": "value_error", "loc": ("body", *exc.field.split(".")), "msg": str(exc), "input": None}
            raise RequestValidationError([problem]) from None
        except InvalidValueError as exc:
            problem = {"type": "value_error", "loc": ("query", query_field), "msg": str(exc), "input": None}
            raise RequestValidationError([problem]) from None


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema with its ``$defs`` written in place, for an operation's inline ``requestBody``."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref")
            if isinstance(reference, str) and reference.startswith("#/$defs/"):
                return resolve(definitions[reference.removeprefix("#/$defs/")])
            # A discriminator's mapping points into $defs; the inlined variants carry their own "kind" constant.
            return {key: resolve(value) for key, value in node.items() if key != "discriminator"}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": resolve(schema)}}}}


def schedule_api_router(
    schedules: ScheduleAdmin, *, actor: Callable[..., str], route_class: type[AdminRoute] = AdminRoute
) -> APIRouter:
    """The schedules' JSON routes over ``schedules``; ``actor`` is a dependency naming who acts."""
    router = APIRouter(prefix="/api", tags=["outboxkit admin: schedules"], route_class=route_class)
    Actor = Annotated[str, Depends(actor)]

    # Registered first: /schedules/new answers POST (OPTIONS lists it), and GET of a schedule named "new" still
    # reaches the route below (a full match wins over this route's method mismatch).
    @router.post(
        "/schedules/new",
        response_model=ScheduleActionResult,
        responses={**_WRITE_ERRORS, 422: _REFUSED},
        dependencies=[Depends(require_json)],
        summary="Create a schedule (422 names the field a rule refuses; nothing is written)",
        openapi_extra=inline_schema(ScheduleCreate),
    )
    async def create(request: Request, who: Actor) -> ScheduleActionResult:
        body: ScheduleCreate = await read_json_body(request, ScheduleCreate)
        with schedule_errors():
            return await run_in_threadpool(lambda: schedules.create(body, actor=who))

    @router.get(
        "/schedules",
        response_model=ScheduleListView,
        responses={400: {"model": ErrorBody, "description": "The cursor does not decode."}},
        summary="Schedules by name, a page at a time: next five fire times, target, last run",
    )
    def schedule_list(
        viewer_timezone: ViewerTimezone = "UTC", cursor: Cursor = None, limit: Limit = DEFAULT_LIST_PAGE
    ) -> ScheduleListView:
        with schedule_errors():
            return schedules.overview(viewer_timezone=viewer_timezone, cursor=cursor, limit=limit)

    # Before /schedules/{name}: a schedule's name starts with a letter or digit, so "_internal" is none.
    @router.get(
        "/schedules/_internal",
        response_model=InternalJobsView,
        summary="The jobs the elected leader runs (the kit's own, marked internal), read-only; the leader",
    )
    def internal_jobs() -> InternalJobsView:
        with schedule_errors():
            return schedules.internal.view()

    @router.get(
        "/schedules/_internal/{job_id:path}/runs",
        response_model=JobRunsView,
        responses={404: {"model": ErrorBody, "description": "No elected job has this id."}},
        summary="One internal job's runs, newest first",
    )
    def internal_job_runs(job_id: JobIdPath, limit: Limit = 50) -> JobRunsView:
        with schedule_errors("limit"):
            return schedules.internal.runs(job_id, limit=limit)

    @router.get("/schedules/{name}", response_model=ScheduleModel, responses={404: _NOT_FOUND}, summary="One schedule")
    def schedule(name: ScheduleName, viewer_timezone: ViewerTimezone = "UTC") -> ScheduleModel:
        with schedule_errors():
            return schedules.schedule(name, viewer_timezone=viewer_timezone)

    @router.get(
        "/schedules/{name}/history",
        response_model=ScheduleHistoryPage,
        summary="One schedule's runs, misses and abandoned runs, newest first (kept after a delete)",
    )
    def history(
        name: ScheduleName,
        outcome: Annotated[
            list[str] | None,
            Query(max_length=10, description="Only these outcomes: running, ok, error, enqueued, missed, abandoned."),
        ] = None,
        before: Annotated[FilterMoment, Query(description="Fire times before this (next_before of the previous page).")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description=f"Page size, 1 to {MAX_PAGE_SIZE}.")] = 50,
    ) -> ScheduleHistoryPage:
        with schedule_errors("outcome"):
            return schedules.history(name, outcomes=outcome, before=before, limit=limit)

    @router.get("/schedules/{name}/audit", response_model=list[ScheduleAuditEntry], summary="One schedule's changes")
    def audit(
        name: ScheduleName, limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="How many, newest first.")] = 50
    ) -> list[ScheduleAuditEntry]:
        with schedule_errors("limit"):
            return schedules.audit(name, limit=limit)

    def action(
        path: str, action_name: str, summary: str, request_model: type[BaseModel], perform: Callable[[str, Any, str], Any]
    ) -> None:
        """A POST whose JSON body is ``request_model``, run as ``perform(schedule name, body, actor)``."""

        async def act(request: Request, who: Actor, name: ScheduleName) -> Any:
            body = await read_json_body(request, request_model)
            with schedule_errors():
                return await run_in_threadpool(perform, name, body, who)

        router.add_api_route(
            path, act, methods=["POST"], response_model=ScheduleActionResult, responses=_WRITE_ERRORS,
            dependencies=[Depends(require_json)], summary=summary, name=f"outboxkit_admin_api_schedule_{action_name}",
            openapi_extra=inline_schema(request_model),
        )

    action(
        "/schedules/{name}/edit", "edit", "Replace a schedule's definition (422 names the field; nothing is written)",
        ScheduleFields, lambda name, body, who: schedules.edit(name, body, actor=who),
    )
    action("/schedules/{name}/enable", "enable", "Enable a schedule (its next fire time counted from now)",
           EmptyRequest, lambda name, body, who: schedules.enable(name, actor=who))
    action("/schedules/{name}/disable", "disable", "Disable a schedule (occurrences while disabled are skipped)",
           EmptyRequest, lambda name, body, who: schedules.disable(name, actor=who))
    action("/schedules/{name}/run-now", "run_now", "Make a schedule due now: one occurrence at this instant",
           EmptyRequest, lambda name, body, who: schedules.run_now(name, actor=who))
    action("/schedules/{name}/delete", "delete", "Delete a schedule (its history and audit stay)",
           EmptyRequest, lambda name, body, who: schedules.delete(name, actor=who))
    return router
