"""A TSDB answer bigger than --max-response-size is refused while it streams in (one clear line, exit 2), never
decoded: a 300 MB answer once took 5.8 GB of memory and 88 s despite --timeout."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from gpuscale.cli.main import main


async def test_an_answer_larger_than_the_limit_is_refused_in_one_line(capsys):
    sent = {"bytes": 0}

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"status":"success","data":["')
        try:
            for _ in range(64):  # up to 64 MiB, streamed without a Content-Length
                await response.write(b"x" * (1 << 20))
                sent["bytes"] += 1 << 20
        except (ConnectionResetError, ConnectionError):
            pass  # the client hung up: what the limit is for
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        started = time.monotonic()
        code = await asyncio.to_thread(
            main,
            [
                "report",
                "--prometheus-url",
                f"http://127.0.0.1:{port}",
                "--max-response-size",
                str(2 << 20),
                "--window",
                "1h",
            ],
        )
        elapsed = time.monotonic() - started
    finally:
        await runner.cleanup()
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "larger than 2 MiB (--max-response-size)" in err, err
    assert "Traceback" not in err
    assert sent["bytes"] < 32 << 20, "the client stopped reading long before the server finished"
    assert elapsed < 30
