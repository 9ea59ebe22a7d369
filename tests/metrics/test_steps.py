"""Steps (metrics/steps.py): ``finish`` and ``run_sliced`` give a generator's result; ``run_sliced`` lets the event loop
serve between slices, serves I/O that became ready before the next slice, and closes the steps when cancelled."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from gpuscale.metrics.steps import finish, run_sliced


def _counting(n: int, spin: float = 0.0, log: list[str] | None = None):
    total = 0
    try:
        for i in range(n):
            total += i
            end = time.perf_counter() + spin
            while time.perf_counter() < end:
                pass
            yield
    finally:
        if log is not None:
            log.append("closed")
    return total


def test_finish_runs_the_steps_to_their_result():
    assert finish(_counting(100)) == sum(range(100))
    assert finish(_counting(0)) == 0


async def test_run_sliced_gives_the_result_and_lets_the_loop_run_between_slices():
    ran: list[float] = []

    async def other() -> None:
        while True:
            ran.append(time.perf_counter())
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    before = len(ran)
    # NB: 200 steps of 0.1 ms in slices of 0.3 ms: the other task gets dozens of turns meanwhile
    assert await run_sliced(_counting(200, spin=0.0001), budget=0.0003) == sum(range(200))
    turns = len(ran) - before
    task.cancel()
    assert turns >= 20, turns


async def test_io_that_became_ready_is_served_before_the_next_slice():
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    served: list[bool] = []
    loop.add_reader(b.fileno(), lambda: served.append(bool(b.recv(1))))
    seen: list[bool] = []

    def steps():
        a.send(b"x")  # NB: a request arriving while a slice runs
        yield
        seen.append(bool(served))  # the next slice: the request was served before it

    try:
        await run_sliced(steps(), budget=0.0)
    finally:
        loop.remove_reader(b.fileno())
        a.close()
        b.close()
    assert seen == [True]


async def test_cancelling_closes_the_steps():
    log: list[str] = []
    task = asyncio.create_task(run_sliced(_counting(10**9, log=log), budget=0.0001))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["closed"]
