from sqlalchemy import select
from sqlalchemy.orm import Session

from outboxkit import OutboxKit, OutboxKitSettings
from tests.support.models import SampleEvent
from tests.support.receiver import Reply


def test_smoke(engine, receiver, clock):
    with Session(engine) as session, session.begin():
        session.add_all([SampleEvent(target_url=receiver.url + "/e", payload={"n": n}) for n in range(10)])
    receiver.respond = lambda r: Reply(status=503) if r.body["n"] == 3 else Reply(status=400) if r.body["n"] == 4 else Reply()
    with OutboxKit(engine, [SampleEvent], clock=clock, settings=OutboxKitSettings()) as kit:
        result = kit.drain_once(SampleEvent)
    print(result)
    with Session(engine) as session:
        rows = session.scalars(select(SampleEvent).order_by(SampleEvent.id)).all()
        for r in rows:
            print(r, r.last_error, r.next_attempt_at)
    assert result.delivered == 8
