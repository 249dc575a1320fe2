"""The schedule pages: the list, one schedule with its history, the create and edit form, and the actions.

::

    GET  /schedules?tz=&cursor=&limit=      schedules by name, a page at a time (the admin's page size unless
                                            limit= asks for 1 to 200): next five fire times in its timezone and
                                            the viewer's; previous and next links as on an outbox's rows
    GET  /schedules/_internal/{job_id}      one internal job (run by the elected leader): its facts and runs, read-only
    GET  /schedules/_new                    the create form (names start with a letter or digit: "_new" is no name)
    POST /schedules/_new                    create; a refusal shows the form again, the error next to its input
    GET  /schedules/{name}?tz=&outcome=&before=   one schedule: facts, fire times, history (paged), changes
    GET  /schedules/{name}/edit             the edit form
    POST /schedules/{name}/edit             edit; a refusal as for create
    POST /schedules/{name}/enable|disable|run-now
    GET  /schedules/{name}/delete           asks first (changes nothing)
    POST /schedules/{name}/delete           delete; its history and audit stay

Each POST follows the admin's discipline (``outboxkit.admin.page_frame``):
the CSRF token first, then the action in a worker thread, audited with the
actor, and a 303 to a page whose flash notice says what happened.  A form
that is refused answers 422 with the form as it was sent, each error next
to its input, and nothing written.

The list ends with the internal jobs, the ones the elected leader runs (the
kit's safety-net drains and housekeeping, and any job registered with the
deprecated ``kit.scheduler.add_job``): read-only, each with its last run,
outcome and next run, and a link to its runs.  The old Jobs page answers
303 here (``outboxkit.admin.pages``).

The viewer's timezone: the pages show each fire time in the schedule's
timezone and in the viewer's.  The server knows the viewer's zone only from
``?tz=`` (a small GET form on the page; UTC when absent), so the pages work
without JavaScript.  With JavaScript, the vendored ``admin.js`` (the CSP
allows script from the admin itself only) rewrites the viewer column into
the browser's own timezone while no ``tz`` was asked for, and fills the
form with it.
"""


# No ``from __future__ import annotations``: FastAPI reads each route's ``Actor`` annotation at runtime.
from collections.abc import Callable
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from outboxkit.admin.api import MAX_PAGE_SIZE, JobIdPath
from outboxkit.admin.confirm_pages import render_confirm
from outboxkit.admin.csrf import CsrfTokens
from outboxkit.admin.flash import Flash, FlashKind, FlashNotices
from outboxkit.admin.page_frame import PageRoutes
from outboxkit.admin.page_inputs import PAGE_SIZES, ascii_number, form_text
from outboxkit.admin.route_guard import AdminRoute
from outboxkit.admin.schedule_form import FormRefused, ScheduleForm
from outboxkit.errors import InvalidScheduleError, PageInputError
from outboxkit.operations.schedule_admin import ScheduleAdmin
from outboxkit.operations.schedule_schemas import RUN_OUTCOMES, SCHEDULE_NAME_PATTERN, ScheduleActionResult
from outboxkit.operations.service import OperationsService

__all__ = ["schedule_pages_router"]

ScheduleName = Annotated[str, Path(max_length=200, pattern=SCHEDULE_NAME_PATTERN)]
Action = Callable[[str, str], ScheduleActionResult]  # (name, actor)
HISTORY_PAGE = 50
LIST_PAGE_FIELDS = ("tz", "limit", "cursor")  # what an action on the list keeps of the page it was pressed on


def _viewer_zone(tz: str | None) -> str:
    if tz is not None and len(tz) > 64:
        raise PageInputError("tz must be an IANA timezone name such as Europe/Berlin")
    return tz.strip() if tz and tz.strip() else "UTC"


def _before(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value) if value.isascii() and len(value) <= 40 else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise PageInputError(f"before must be a time with its offset, as the page's older-runs link gives it; got {value[:40]!r}")
    return moment


def schedule_pages_router(
    service: OperationsService,
    schedules: ScheduleAdmin,
    *,
    actor: Callable[..., str],
    csrf: CsrfTokens,
    flashes: FlashNotices,
    page_size: int,
    route_class: type[AdminRoute] = AdminRoute,
) -> APIRouter:
    """The schedule pages over ``schedules`` (the same page frame as the other pages: CSRF, flash, error pages)."""
    routes = PageRoutes.create(
        service, actor=actor, csrf=csrf, flashes=flashes, page_size=page_size, route_class=route_class
    )
    add_schedule_list(routes, schedules)
    add_internal_job(routes, schedules)  # before /schedules/{name}/...: "_internal" is no schedule's name
    add_schedule_form(routes, schedules)  # before /schedules/{name}: "_new" is no schedule's name, but keep it first
    add_schedule(routes, schedules)
    add_schedule_action(routes, "enable", lambda name, who: schedules.enable(name, actor=who), done="schedule_enabled")
    add_schedule_action(routes, "disable", lambda name, who: schedules.disable(name, actor=who), done="schedule_disabled")
    add_schedule_action(routes, "run-now", lambda name, who: schedules.run_now(name, actor=who), done="schedule_run_now")
    add_schedule_delete(routes, schedules)
    return routes.router


def add_schedule_list(routes: PageRoutes, schedules: ScheduleAdmin) -> None:
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/schedules", name="outboxkit_admin_schedules")
    def schedule_list(
        request: Request, who: Actor, tz: str | None = None, cursor: str | None = None, limit: str | None = None
    ) -> Response:
        def build() -> Response:
            zone = _viewer_zone(tz)
            size = ascii_number(limit, low=1, high=MAX_PAGE_SIZE, what="the page size") if limit else routes.page_size
            view = schedules.overview(viewer_timezone=zone, cursor=cursor, limit=size)
            zone_asked = bool(tz and tz.strip())
            # What the pager's links and the timezone form keep: the zone asked for and the page size chosen.
            page_query = {"tz": zone if zone_asked else None, "limit": limit or None}
            return frame.render(
                request, who, "schedules.html", view=view, zone_asked=zone_asked,
                page_query={key: value for key, value in page_query.items() if value},
                page_sizes=sorted({*PAGE_SIZES, routes.page_size}),
                cursor=cursor or None,
            )

        return frame.guarded(request, who, build)


def add_internal_job(routes: PageRoutes, schedules: ScheduleAdmin) -> None:
    """One internal job's facts and its newest runs (a page of the admin's page size), read-only."""
    frame, page_size = routes.frame, routes.page_size
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/schedules/_internal/{job_id:path}", name="outboxkit_admin_internal_job")
    def internal_job(request: Request, job_id: JobIdPath, who: Actor) -> Response:
        def build() -> Response:
            job = schedules.internal.entry(job_id)
            history = schedules.internal.history(job, limit=page_size)
            return frame.render(request, who, "job.html", history=history, job=job, page_size=page_size)

        return frame.guarded(request, who, build)


def add_schedule(routes: PageRoutes, schedules: ScheduleAdmin) -> None:
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/schedules/{name}", name="outboxkit_admin_schedule")
    def schedule(
        request: Request, name: ScheduleName, who: Actor, tz: str | None = None, outcome: str | None = None,
        before: str | None = None,
    ) -> Response:
        def build() -> Response:
            if outcome and outcome not in RUN_OUTCOMES:
                raise PageInputError(f"outcome must be one of {', '.join(RUN_OUTCOMES)}")
            zone = _viewer_zone(tz)
            entry = schedules.schedule(name, viewer_timezone=zone)
            history = schedules.history(
                name, outcomes=[outcome] if outcome else None, before=_before(before), limit=HISTORY_PAGE
            )
            return frame.render(
                request, who, "schedule.html", schedule=entry, history=history, audit=schedules.audit(name, limit=20),
                outcomes=RUN_OUTCOMES, outcome=outcome or "", zone_asked=bool(tz and tz.strip()), tz=tz or "",
                paged=before is not None,
            )

        return frame.guarded(request, who, build)


def add_schedule_form(routes: PageRoutes, schedules: ScheduleAdmin) -> None:
    """Create and edit: the same form; a refused one comes back (422) with each error next to its input."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    def render_form(request: Request, who: str, form: ScheduleForm, *, name: str | None, status_code: int = 200) -> Response:
        return frame.render(
            request, who, "schedule_form.html", form=form, name=name, jobs=schedules.job_names(),
            outboxes=schedules.request_outboxes, status_code=status_code,
            action=frame.url(request, "schedule_edit_apply", name=name) if name else frame.url(request, "schedule_create"),
        )

    def submit(request: Request, who: str, form_data: FormData, name: str | None) -> Response:
        form = ScheduleForm.posted(form_data)
        try:
            if name is None:
                result = schedules.create(form.create_request(), actor=who)
            else:
                result = schedules.edit(name, form.edit_request(), actor=who)
        except FormRefused as exc:
            return render_form(request, who, ScheduleForm(values=form.values, errors=exc.errors), name=name, status_code=422)
        except InvalidScheduleError as exc:
            return render_form(request, who, form.refuse(exc.field, str(exc)), name=name, status_code=422)
        kind: FlashKind = "schedule_created" if name is None else "schedule_edited"
        return frame.redirect(request, who, frame.url(request, "schedule", name=result.name), Flash(kind=kind))

    @routes.router.get("/schedules/_new", name="outboxkit_admin_schedule_new")
    def new(request: Request, who: Actor) -> Response:
        return frame.guarded(request, who, lambda: render_form(request, who, ScheduleForm.blank(), name=None))

    @routes.router.post("/schedules/_new", name="outboxkit_admin_schedule_create")
    async def create(request: Request, who: Actor) -> Response:
        return await frame.post_action(request, who, lambda form: submit(request, who, form, None))

    @routes.router.get("/schedules/{name}/edit", name="outboxkit_admin_schedule_edit")
    def edit(request: Request, name: ScheduleName, who: Actor) -> Response:
        return frame.guarded(
            request, who, lambda: render_form(request, who, ScheduleForm.of(schedules.editable(name)), name=name)
        )

    @routes.router.post("/schedules/{name}/edit", name="outboxkit_admin_schedule_edit_apply")
    async def edit_apply(request: Request, name: ScheduleName, who: Actor) -> Response:
        return await frame.post_action(request, who, lambda form: submit(request, who, form, name))


def add_schedule_action(routes: PageRoutes, path: str, perform: Action, *, done: FlashKind) -> None:
    """A button on the list or a schedule's page: ``perform`` it, then back where it was pressed."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    async def act(request: Request, name: ScheduleName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            perform(name, who)
            if form_text(form, "back") == "list":  # the list's page it was pressed on (its tz, limit and cursor)
                kept = {field: form_text(form, field) for field in LIST_PAGE_FIELDS}
                target = frame.url(request, "schedules", kept)
            else:
                target = frame.url(request, "schedule", name=name)
            return frame.redirect(request, who, target, Flash(kind=done))

        return await frame.post_action(request, who, build)

    route = path.replace("-", "_")
    routes.router.add_api_route(f"/schedules/{{name}}/{path}", act, methods=["POST"], name=f"outboxkit_admin_schedule_{route}")


def add_schedule_delete(routes: PageRoutes, schedules: ScheduleAdmin) -> None:
    """Delete asks first: a page that says what a delete keeps, with the form that deletes."""
    frame = routes.frame
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/schedules/{name}/delete", name="outboxkit_admin_schedule_delete_confirm")
    def delete_confirm(request: Request, name: ScheduleName, who: Actor) -> Response:
        def build() -> Response:
            entry = schedules.editable(name, action="delete")
            return render_confirm(
                frame, request, who,
                heading=f"Delete the schedule {entry.name}?",
                explanation=[
                    f"It fires {entry.description}; after the delete no process fires it again. Its run history and "
                    "its audit stay; a run in progress finishes and is recorded.",
                    "It was created through the admin or the API: it does not come back.",
                ],
                action=frame.url(request, "schedule_delete", name=name),
                fields=[],
                button="Delete schedule",
                cancel=frame.url(request, "schedule", name=name),
            )

        return frame.guarded(request, who, build)

    @routes.router.post("/schedules/{name}/delete", name="outboxkit_admin_schedule_delete")
    async def delete(request: Request, name: ScheduleName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            schedules.delete(name, actor=who)
            return frame.redirect(request, who, frame.url(request, "schedules"), Flash(kind="schedule_deleted"))

        return await frame.post_action(request, who, build)
