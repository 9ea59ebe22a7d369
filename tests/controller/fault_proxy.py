"""A TCP proxy between a process under test and the Kubernetes API that can fail the way networks and API
servers do: ``drop()`` cuts every open connection mid-stream (what a restarting apiserver or a load balancer's
idle timeout does to watches), ``cut()`` also refuses new ones until ``restore()`` (an API outage). It forwards
bytes only, so TLS and authentication are end to end and the same proxy serves kube-apiserver and gpuscale/sim.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FaultProxy"]


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._down = False

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def drop(self) -> int:
        """Cut every open connection (both directions, no orderly close); returns how many."""
        writers, self._open = self._open, set()
        for writer in writers:
            transport = writer.transport
            if transport is not None:
                transport.abort()
        return len(writers) // 2

    def cut(self) -> None:
        """An outage: open connections cut, new ones closed at once, until ``restore``."""
        self._down = True
        self.drop()

    def restore(self) -> None:
        self._down = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._open.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._open.difference_update((writer, up_writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
