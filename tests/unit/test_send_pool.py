"""The send pool: the thread that went idle last takes the next job, at most ``size`` threads, shutdown finishes the queue."""

from __future__ import annotations

import threading

import pytest

from outboxkit.drain.send_pool import SendPool
from outboxkit.errors import KitClosedError
from tests.support.leadership import wait_until


def test_jobs_sent_one_at_a_time_all_run_on_one_thread():
    pool = SendPool(8, name="test-send")
    ran_on: list[str] = []
    try:
        for _ in range(20):
            done = threading.Event()
            pool.submit(lambda done=done: (ran_on.append(threading.current_thread().name), done.set()))
            assert done.wait(10)
            wait_until(lambda: pool.idle == pool.threads, message="the thread went back idle")
        assert set(ran_on) == {"test-send-0"} and pool.threads == 1
    finally:
        pool.shutdown()


def test_the_thread_that_went_idle_last_takes_the_next_job():
    pool = SendPool(4, name="test-send")
    release = [threading.Event() for _ in range(3)]
    started = threading.Barrier(4)
    try:
        for event in release:  # three jobs at once: three threads
            pool.submit(lambda event=event: (started.wait(10), event.wait(10)))
        started.wait(10)
        assert pool.threads == 3
        names: list[str] = []
        for event in release:  # they finish in submission order: test-send-2 goes idle last
            event.set()
            idle = pool.idle
            wait_until(lambda idle=idle: pool.idle == idle + 1, message="a thread went idle")
        done = threading.Event()
        pool.submit(lambda: (names.append(threading.current_thread().name), done.set()))
        assert done.wait(10)
        assert names == ["test-send-2"]
    finally:
        pool.shutdown()


def test_no_more_than_size_threads_run_and_queued_jobs_run_when_one_is_free():
    pool = SendPool(2, name="test-send")
    gate = threading.Event()
    finished: list[int] = []
    lock = threading.Lock()

    def job(n: int) -> None:
        gate.wait(10)
        with lock:
            finished.append(n)

    try:
        for n in range(6):
            pool.submit(job, n)
        assert pool.threads == 2  # the other four wait in the queue
        gate.set()
    finally:
        pool.shutdown()  # lets the queued jobs finish first
    assert sorted(finished) == list(range(6))
    assert pool.threads == 2


def test_shutdown_ends_idle_threads_and_refuses_new_jobs():
    pool = SendPool(3, name="test-send")
    done = threading.Event()
    pool.submit(done.set)
    assert done.wait(10)
    wait_until(lambda: pool.idle == 1, message="the thread went idle")
    pool.shutdown()
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("test-send-")]
    with pytest.raises(KitClosedError):
        pool.submit(done.set)


def test_allow_extra_runs_queued_jobs_beyond_size_and_never_more_than_max_extra():
    pool = SendPool(2, name="test-send", max_extra=2)
    release = threading.Event()
    running: list[int] = []
    lock = threading.Lock()

    def job(n: int) -> None:
        with lock:
            running.append(n)
        release.wait(10)

    try:
        for n in range(7):
            pool.submit(job, n)
        wait_until(lambda: len(running) == 2, message="two jobs run, five wait")
        pool.allow_extra(1)  # one send hung: one more runs
        wait_until(lambda: len(running) == 3, message="a third job runs")
        pool.allow_extra(10)  # never beyond max_extra more
        wait_until(lambda: len(running) == 4, message="a fourth job runs")
        assert pool.threads == 4 and pool.extra == 2
        pool.allow_extra(0)  # the hung sends ended: the busy threads drain back to size before more start
        release.set()
    finally:
        pool.shutdown()
    assert sorted(running) == list(range(7)) and pool.threads == 4
