"""One Prometheus client for every command (sources/promapi.py, issue 33 item 1).

Scope: each command's ``--prometheus-*`` flags build the same client, so a server that requires a client certificate
and a bearer token answers the adapter, controller, top, report and simulate alike; the range side (retries, size
cap, a refusal by size) as the report and simulate use it. The refresh side (PrometheusSource over this client) is
pinned in test_prometheus.py.
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import trustme
from aiohttp import web

from gpuscale.cli.report import ReportSettings
from gpuscale.cli.simulate import SimulateSettings
from gpuscale.cli.top import TopSettings
from gpuscale.errors import SourceUnavailable
from gpuscale.settings import AdapterSettings, ControllerSettings
from gpuscale.sources.promapi import PrometheusClient, TooManySamples

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("pki")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client = ca.issue_cert("gpuscale-client.example")
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    (d / "token").write_text(TOKEN + "\n")
    return ca, ca.issue_cert("localhost", "127.0.0.1"), d


async def _server(pki, handler: Any) -> tuple[web.AppRunner, str]:
    """An HTTPS server that requires a client certificate from the test CA."""
    ca, server, _ = pki
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    app = web.Application()
    app.router.add_route("*", "/api/v1/{call:.*}", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, f"https://localhost:{runner.addresses[0][1]}"


async def _matrix(request: web.Request) -> web.Response:
    if request.headers.get("Authorization") != f"Bearer {TOKEN}":
        return web.json_response({"status": "error", "error": "unauthorized"}, status=401)
    result = [{"metric": {"pod": "p0"}, "values": [[1000, "1"], [1015, "2"]]}]
    return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})


COMMANDS = {
    "adapter": (AdapterSettings, {}),
    "controller": (ControllerSettings, {}),
    "top": (TopSettings, {"view": "pods"}),
    "report": (ReportSettings, {}),
    "simulate": (SimulateSettings, {"hpa": ["hpa.yaml"]}),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
async def test_every_command_reaches_a_server_that_wants_a_client_certificate_and_a_token(pki, command):
    _, _, d = pki
    runner, url = await _server(pki, _matrix)
    model, required = COMMANDS[command]
    settings = model(
        prometheus_url=url,
        prometheus_token_file=str(d / "token"),
        prometheus_ca_file=str(d / "ca.pem"),
        prometheus_client_cert=str(d / "client.pem"),
        prometheus_client_key=str(d / "client.key"),
        **required,
    )
    client = PrometheusClient.connect(settings.prometheus)
    try:
        result = await client.query_range("up", start=1000, end=1015, step=15)
        assert result[0]["metric"] == {"pod": "p0"}
        without = PrometheusClient(url, ca_file=str(d / "ca.pem"), bearer_token=TOKEN)
        with pytest.raises(SourceUnavailable):  # NB: the server really wants the certificate
            await without.query_range("up", start=1000, end=1015, step=15)
        await without.close()
    finally:
        await client.close()
        await runner.cleanup()


async def test_retries_then_the_size_cap_and_a_refusal_by_size(pki):
    _, _, d = pki
    calls: list[str] = []

    async def flaky(request: web.Request) -> web.Response:
        query = (await request.post()).get("query", "")
        calls.append(str(query))
        if query == "flaky" and calls.count("flaky") < 3:
            return web.Response(status=503, text="busy")
        if query == "big":
            return web.Response(text="x" * 4096)
        if query == "huge":
            return web.json_response(
                {"status": "error", "error": "query processing would load too many samples"}, status=422
            )
        return await _matrix(request)

    runner, url = await _server(pki, flaky)
    options: dict[str, Any] = {"client_cert": str(d / "client.pem"), "client_key": str(d / "client.key")}
    client = PrometheusClient(
        url,
        ca_file=str(d / "ca.pem"),
        bearer_token=TOKEN,
        retries=2,
        backoff_seconds=0.0,
        max_body_bytes=1024,
        max_body_flag="--max-response-size",
        **options,
    )
    try:
        assert len(await client.query_range("flaky", start=1000, end=1015, step=15)) == 1
        assert calls.count("flaky") == 3 and client.queries == 3
        with pytest.raises(SourceUnavailable, match=r"larger than 1 KiB \(--max-response-size\)"):
            await client.query_range("big", start=1000, end=1015, step=15)
        with pytest.raises(TooManySamples, match="too many samples"):
            await client.query_range("huge", start=1000, end=1015, step=15)
    finally:
        await client.close()
        await runner.cleanup()
