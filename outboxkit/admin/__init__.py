"""The outboxkit admin: a FastAPI router with a JSON API and server-rendered pages.

::

    from outboxkit.admin import create_admin_router
    app.include_router(create_admin_router(kit, dependencies=[Depends(require_admin)]), prefix="/admin")

``create_tenant_router(kit, tenant=Depends-able)`` is the subscriptions API an application mounts for its own
customers, each scoped to its tenant (``tenant_subscriptions``).

Needs the ``admin`` extra (FastAPI, Jinja2, python-multipart); this package is
the only place outboxkit imports them.  See docs/admin.md.
"""

try:
    import fastapi  # noqa: F401
    import jinja2  # noqa: F401
    import python_multipart  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        f"outboxkit.admin needs FastAPI, Jinja2 and python-multipart ({exc.name} is missing): "
        "pip install 'outboxkit[admin]'"
    ) from exc

from outboxkit.admin.csrf import CSRF_COOKIE, CSRF_FIELD
from outboxkit.admin.router import ACTOR_STATE_ATTRIBUTE, create_admin_router
from outboxkit.admin.tenant_subscriptions import create_tenant_router
from outboxkit.errors import RowsHeld, RowsNotFound
from outboxkit.operations.job_status import DRAIN_JOB_PREFIX, JobInfo, JobSource, drain_job_id
from outboxkit.operations.service import OperationsService

__all__ = [
    "ACTOR_STATE_ATTRIBUTE",
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "DRAIN_JOB_PREFIX",
    "JobInfo",
    "JobSource",
    "OperationsService",
    "RowsHeld",
    "RowsNotFound",
    "create_admin_router",
    "create_tenant_router",
    "drain_job_id",
]
