"""A command's coroutine result leaves asyncio without being formatted (gpuscale/cli/run_coroutine.py)."""

from __future__ import annotations

import asyncio
import signal

from gpuscale.cli.run_coroutine import run_coroutine


class Formatted:
    """Counts how often it is formatted: a report's history costs seconds (every numpy array printed)."""

    def __init__(self) -> None:
        self.reprs = 0

    def __repr__(self) -> str:
        self.reprs += 1
        return "Formatted()"


async def _result(x: Formatted) -> Formatted:
    await asyncio.sleep(0)
    return x


def test_asyncio_run_itself_formats_the_result_on_this_python():
    # the reason for run_coroutine: if a Python stops doing this, the test says so and the helper can go
    x = Formatted()
    assert asyncio.run(_result(x)) is x
    assert x.reprs > 0


def test_the_result_is_returned_unformatted_and_sigint_is_restored():
    x = Formatted()
    assert run_coroutine(_result(x)) is x
    assert x.reprs == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_exception_still_propagates():
    async def fails() -> None:
        raise LookupError("no such series")

    try:
        run_coroutine(fails())
    except LookupError as e:
        assert str(e) == "no such series"
    else:
        raise AssertionError("the exception was lost")
