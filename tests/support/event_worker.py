"""A process that publishes events, or one that edits subscriptions, for the test of both at once.

    python -m tests.support.event_worker <sqlalchemy url> publish <count>
    python -m tests.support.event_worker <sqlalchemy url> edit <count> <receiver url>

``publish`` writes ``count`` events of ``invoice.paid``, each in a transaction of its own with a business row
beside it.  ``edit`` makes ``count`` changes: it creates subscriptions (paths ``/sub-<n>``), edits, disables,
enables and deletes them in turn.  Each prints ``ready`` once connected, waits for a line on stdin so both start
together, and prints ``done`` at the end.
"""

from __future__ import annotations

import sys

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from outboxkit import publish
from outboxkit.events import SubscriptionStore
from outboxkit.url_guard import UrlGuard
from tests.support.events import definition
from tests.support.schedules import LOOPBACK_ALLOWED


def publish_events(url: str, count: int) -> None:
    engine = create_engine(url)
    print("ready", flush=True)
    sys.stdin.readline()
    for number in range(count):
        with Session(engine) as session, session.begin():
            session.execute(text("INSERT INTO event_worker_orders (number) VALUES (:number)"), {"number": number})
            publish(session, "invoice.paid", {"number": number}, key=str(number % 3))
    engine.dispose()


def edit_subscriptions(url: str, count: int, receiver: str) -> None:
    engine = create_engine(url)
    store = SubscriptionStore(engine, url_guard=UrlGuard.from_entries(LOOPBACK_ALLOWED))
    print("ready", flush=True)
    sys.stdin.readline()
    live: list[int] = []
    for number in range(count):
        step = number % 5
        if step in (0, 1) or not live:
            live.append(store.create(definition(f"{receiver}/sub-{number}", "invoice.*", seed=number), actor="editor").id)
        elif step == 2:
            store.edit(live[0], definition(f"{receiver}/sub-edited-{number}", "invoice.paid", seed=live[0]), actor="editor")
        elif step == 3:
            store.disable(live[-1], reason="toggled", actor="editor")
            store.enable(live[-1], actor="editor") if number % 2 else None
        else:
            store.delete(live.pop(1 if len(live) > 1 else 0), actor="editor")
    engine.dispose()


def main() -> None:
    url, mode, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "publish":
        publish_events(url, count)
    else:
        edit_subscriptions(url, count, sys.argv[4])
    print("done", flush=True)


if __name__ == "__main__":
    main()
