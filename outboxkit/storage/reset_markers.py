"""Reset markers: a reset (or a replay) leaves its mark in a row's attempt history, in the reset's own statement.

A reset sets a row's ``attempts`` back to 0, so the retry budget starts
again; the attempt history (``outboxkit_attempts``) counts on.  The statement
that resets rows also writes, for each row it reset, a marker (outcome
``reset``, ``sender`` the person or tool that reset it, ``attempt`` the
number the row's attempts had reached: the previous marker's number plus
the attempts made since).  The drain numbers each later attempt from the
latest marker that came before its claim, both by the
database server's clock (``outboxkit.storage.attempts``),
so no round trip is added anywhere and the number survives retention as
long as the marker does.  The row page shows the marker in the attempt list.

``MARKERS`` is a common table expression over a ``changed`` CTE of the
statement, ``(id, attempts_before)``; with ``:mark_history`` false (an
attempt history of 0 days records nothing) it writes nothing.
"""

from __future__ import annotations

__all__ = ["MARKERS", "MARKER_SENDER_CHARS", "marker_parameters"]

MARKER_SENDER_CHARS = 300

MARKERS = """markers AS (
    INSERT INTO outboxkit_attempts (outbox, row_id, attempt, started_at, finished_at, outcome, sender)
    SELECT CAST(:mark_outbox AS text), changed.id,
           changed.attempts_before + COALESCE((
               SELECT marker.attempt FROM outboxkit_attempts AS marker
               WHERE marker.outbox = CAST(:mark_outbox AS text) AND marker.row_id = changed.id
                 AND marker.outcome = 'reset'
               ORDER BY marker.finished_at DESC, marker.id DESC LIMIT 1
           ), 0),
           :now, :now, 'reset', CAST(:mark_sender AS text)
    FROM changed WHERE CAST(:mark_history AS boolean)
)"""


def marker_parameters(outbox_name: str, actor: str, *, history: bool) -> dict[str, object]:
    """The parameters of ``MARKERS``: the outbox as the history names it, who reset, whether a history is kept."""
    return {"mark_outbox": outbox_name, "mark_sender": actor[:MARKER_SENDER_CHARS], "mark_history": history}
