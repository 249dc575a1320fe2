"""The admin's JSON API for the inbox (documented in the application's OpenAPI schema).

Routes, relative to where the application mounts the router::

    GET  /api/inbox    every source: received, duplicates dropped, last received, handler failures

Read-only: the inbox has no operator action.  Errors: 503 as for every admin route.
"""

from fastapi import APIRouter

from outboxkit.admin.route_guard import AdminRoute
from outboxkit.operations.inbox import InboxOperations, InboxView
from outboxkit.operations.service import OperationsService

__all__ = ["inbox_api_router"]


def inbox_api_router(service: OperationsService, *, route_class: type[AdminRoute] = AdminRoute) -> APIRouter:
    """The inbox route over ``service``'s kit."""
    router = APIRouter(prefix="/api", tags=["outboxkit admin"], route_class=route_class)
    operations = InboxOperations(service.kit)

    @router.get("/inbox", response_model=InboxView, summary="The inbox per source: received, duplicates, failures")
    def inbox() -> InboxView:
        return operations.view()

    return router
