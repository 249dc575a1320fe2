"""Pages that ask before an action: "Pause drains", "Drain now" on a paused outbox, "Reset all N on this page".

Each is a page that says what the action will do (with the outbox's counts,
or the ids it will touch) and changes nothing; its form, CSRF-protected like
every other, posts the action itself.  They work without JavaScript: the
action's button opens the page (a GET form, or for the page's ids a
``formaction`` to the POST that renders it).
"""


# No ``from __future__ import annotations``: FastAPI reads each route's ``Actor`` annotation at runtime.
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from outboxkit.admin.api import OutboxName
from outboxkit.admin.page_frame import PageFrame, PageRoutes
from outboxkit.admin.page_inputs import selected_ids
from outboxkit.operations.schemas import OutboxOverview

__all__ = ["add_drain_now_confirm", "add_pause_confirm", "add_reset_page_confirm"]


def render_confirm(
    frame: PageFrame, request: Request, who: str, *, heading: str, explanation: list[str], action: str,
    fields: list[tuple[str, str]], button: str, cancel: str, ids: list[int] | None = None,
) -> Response:
    """A confirmation page: what the action will do, and the CSRF-protected form that does it (nothing changes before)."""
    return frame.render(
        request, who, "confirm.html", heading=heading, explanation=explanation, action=action, fields=fields,
        button=button, danger=True, cancel=cancel, ids=ids or [],
    )


@dataclass(frozen=True)
class ControlQuestion:
    """What a confirmation page asks before an outbox control: its text, and the action (a route name) its form posts to."""

    heading: str
    explanation: list[str]
    action: str
    button: str


def add_control_confirm(routes: PageRoutes, path: str, name: str, ask: Callable[[OutboxOverview], ControlQuestion]) -> None:
    """A GET page that asks before an outbox control (changes nothing); its CSRF-protected form posts the control."""
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]

    def confirm(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build() -> Response:
            question = ask(service.outbox_overview(outbox))
            return render_confirm(
                frame, request, who,
                heading=question.heading,
                explanation=question.explanation,
                action=frame.url(request, question.action, outbox=outbox),
                fields=[],
                button=question.button,
                cancel=frame.url(request, "rows", outbox=outbox),
            )

        return frame.guarded(request, who, build)

    routes.router.add_api_route(path, confirm, methods=["GET"], name=f"outboxkit_admin_{name}")


def add_pause_confirm(routes: PageRoutes) -> None:
    """"Pause drains" asks first: this page says what a pause does; its form posts the pause."""

    def ask(summary: OutboxOverview) -> ControlQuestion:
        counts = summary.counts
        return ControlQuestion(
            heading=f"Pause the drains of {summary.name}?",
            explanation=[
                "No process will claim this outbox's rows until it is resumed: drain loops, worker processes, "
                "the leader's drain job and drain_once alike. Rows in flight finish and are recorded; "
                "new rows wait as pending with their due times.",
                f"Now: {counts.pending:,} pending ({counts.in_flight:,} in flight), {counts.stuck:,} stuck.",
            ],
            action="pause",
            button="Pause drains",
        )

    add_control_confirm(routes, "/outboxes/{outbox}/pause", "pause_confirm", ask)


def add_drain_now_confirm(routes: PageRoutes) -> None:
    """"Drain now" on a paused outbox: a pause means no process claims its rows, so this page offers to resume first."""

    def ask(summary: OutboxOverview) -> ControlQuestion:
        if not summary.paused:  # resumed since the button was drawn: nothing to resume
            return ControlQuestion(
                heading=f"Drain {summary.name} now?",
                explanation=["Every drain of this outbox is woken to claim its due rows now."],
                action="drain_now",
                button="Drain now",
            )
        return ControlQuestion(
            heading=f"{summary.name} is paused: resume and drain now?",
            explanation=[
                f"{summary.paused_by} paused this outbox's drains: no process claims its rows while it is paused, "
                "so draining now means resuming it.",
                "Resume and drain now resumes the drains in every process and wakes them to claim the "
                f"{summary.counts.pending:,} pending row(s) that are due.",
            ],
            action="resume_and_drain_now",
            button="Resume and drain now",
        )

    add_control_confirm(routes, "/outboxes/{outbox}/drain-now", "drain_now_confirm", ask)


def add_reset_page_confirm(routes: PageRoutes) -> None:
    """"Reset all N on this page" asks first: the page's ids, listed, with the form that resets them."""
    frame, service = routes.frame, routes.service
    Actor = Annotated[str, Depends(routes.actor)]

    async def reset_page_confirm(request: Request, outbox: OutboxName, who: Actor) -> Response:
        def build(form: FormData) -> Response:
            service.kit.outbox(outbox)  # UnknownOutboxError (404) for a bad name
            ids = selected_ids(form.getlist("page_ids"))
            return render_confirm(
                frame, request, who,
                heading=f"Reset {len(ids):,} row(s) of {outbox}?",
                explanation=[
                    "Each of these rows that is still stuck becomes pending with attempts 0, due now, and the next drain "
                    "sends it again. Rows no longer stuck are left alone.",
                ],
                ids=ids,
                action=frame.url(request, "reset_selected", outbox=outbox),
                fields=[("scope", "page")] + [("page_ids", str(row_id)) for row_id in ids],
                button=f"Reset {len(ids):,} row(s)",
                cancel=frame.url(request, "rows", {"status": "stuck"}, outbox=outbox),
            )

        return await frame.post_action(request, who, build)

    routes.router.add_api_route(
        "/outboxes/{outbox}/reset-page", reset_page_confirm, methods=["POST"], name="outboxkit_admin_reset_page_confirm"
    )
