"""The admin's Inbox page: per source, received, duplicates dropped, last received, handler failures.

::

    GET  /inbox    every source of the inbox (read-only; its JSON twin is GET /api/inbox)
"""

# No ``from __future__ import annotations``: FastAPI reads each route's ``Actor`` annotation at runtime.
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response

from outboxkit.admin.page_frame import PageRoutes
from outboxkit.operations.inbox import InboxOperations

__all__ = ["add_inbox_pages"]


def add_inbox_pages(routes: PageRoutes) -> None:
    """The Inbox page."""
    frame, operations = routes.frame, InboxOperations(routes.service.kit)
    Actor = Annotated[str, Depends(routes.actor)]

    @routes.router.get("/inbox", name="outboxkit_admin_inbox")
    def inbox(request: Request, who: Actor) -> Response:
        return frame.guarded(request, who, lambda: frame.render(request, who, "inbox.html", view=operations.view()))
