"""The drain: claim due rows, deliver them, record each outcome.

Read in this order:
* ``drainer``: ``Drainer`` composing the steps, ``drain_once``, the loop's wake-up; its docstring
  says which invariant each step protects;
* ``claim`` (step 1): one statement, its own committed transaction: the attempt is counted and the
  lease stamped before any send;
* ``pump`` (steps 2 and 3): build and send, several at a time, and the pump that keeps the claim fed;
  ``loop`` holds its state between events; ``send_pool`` its bounded threads and in-flight limit;
  ``hung_sends`` which sends stop counting against concurrency;
* ``record`` (step 4): each outcome written in its own short transaction under the claim token;
* ``worker``: this process's drain loops, woken by NOTIFY and by due times;
* ``kit_core``: ``KitCore``, the kit's delivery side (engine, outboxes, their drainers, transport,
  telemetry); ``pooler_checks``: the start-up checks behind a transaction pooler.

Invariants (docs/concepts.md): two drains receive disjoint rows; claim before send; one row's failure
never touches its neighbours; a reset or re-claimed row is never clobbered; the lease outlasts every
attempt; a crash loses no row.
"""
