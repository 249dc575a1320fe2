"""Two processes at once, one publishing events beside business rows and one creating, editing, disabling and
deleting subscriptions: neither fails, every event commits with its business row, no delivery escapes a change (none
is left for the send to refuse), and once drained nothing reaches a subscription deleted or disabled, while every
enabled subscription's deliveries arrive signed with its secret."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from tests.support.database import sqlalchemy_url
from tests.support.events import events_kit, secret, verified  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 60
CHANGES = 40


def test_publishing_and_editing_subscriptions_at_once(events_kit, database_url, receiver):
    with events_kit.engine.begin() as connection:
        connection.execute(text("CREATE TABLE event_worker_orders (number integer PRIMARY KEY)"))
    url = sqlalchemy_url(database_url)
    commands = [
        [sys.executable, "-m", "tests.support.event_worker", url, "publish", str(EVENTS)],
        [sys.executable, "-m", "tests.support.event_worker", url, "edit", str(CHANGES), receiver.url],
    ]
    processes = [subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for command in commands]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=120)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    assert [process.returncode for process in processes] == [0, 0] and all("done" in out for out in outputs)

    events_kit.events.secrets.refresh_seconds = 0
    events_kit.drain()
    with events_kit.engine.connect() as connection:
        orders = connection.scalar(text("SELECT count(*) FROM event_worker_orders"))
        published = connection.scalar(text("SELECT count(*) FROM outboxkit_events"))
        live = {row.id: row for row in connection.execute(text("SELECT id, url, enabled FROM outboxkit_subscriptions"))}
        pending = connection.scalar(text("SELECT count(*) FROM outboxkit_event_deliveries WHERE status = 'pending'"))
        refused = connection.scalar(text("SELECT count(*) FROM outboxkit_event_deliveries WHERE last_error LIKE '%refused%'"))
        per_event = connection.scalar(text(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM outboxkit_event_deliveries GROUP BY event_id) AS c"
        ))
        created = connection.scalar(text("SELECT count(*) FROM outboxkit_subscription_audit WHERE action = 'create'"))
    assert orders == published == EVENTS and pending == refused == 0 and per_event <= created
    # The worker signs a created subscription with seed <n> (its path /sub-<n>), an edited one with seed <id>.
    enabled_paths = {"/" + row.url.rsplit("/", 1)[1]: row.id for row in live.values() if row.enabled}
    for request in receiver.requests:
        assert request.path in enabled_paths, f"{request.path} is deleted or disabled, yet it received a delivery"
        edited = request.path.startswith("/sub-edited-")
        seed = enabled_paths[request.path] if edited else int(request.path.removeprefix("/sub-"))
        assert verified(request, secret(seed))
