"""Where ``gpuscale top`` shows its frames, and the loop that makes them.

``Screen``: stdout once; with ``--watch`` a rich Live redrawn in place on a terminal, frames one after
another otherwise. ``show_frames``: collect → sort → show, every ``interval`` until ``stop`` (Ctrl-C) or
``iterations``; the first refresh must succeed, a later failure is shown in the frame and watching goes on.

NB: rich is imported when a screen is made: ``gpuscale`` builds every subcommand's flags at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

from gpuscale.errors import GpuscaleError
from gpuscale.metrics.diagnosis import DiagnosisPolicy
from gpuscale.top.collect import Collector
from gpuscale.top.columns import RenderOptions
from gpuscale.top.document import GpuTopList, Scope
from gpuscale.top.render import render
from gpuscale.top.sorting import sort_items

__all__ = ["Screen", "show_frames", "unless_stopped"]


class Screen:
    """Where frames go: stdout once; with --watch a rich Live on a terminal, frames in sequence otherwise."""

    def __init__(
        self,
        policy: DiagnosisPolicy,
        scope: Scope,
        *,
        output: str,
        headers: bool,
        watch: bool,
        watch_interval: float,
    ) -> None:
        from rich.console import Console

        self.policy = policy
        self.scope = scope
        self.output = output
        self.headers = headers
        self.watch = watch
        self.watch_interval = watch_interval
        self.console = Console(highlight=False, soft_wrap=False)
        self.terminal = self.console.is_terminal
        self.structured = output in ("json", "yaml")
        self._live: Any = None
        self._frames = 0
        self._last: GpuTopList | None = None

    def _width(self) -> int | None:
        if self.structured:
            return None
        if self.terminal:
            return self.console.width
        return None  # NB: piped, as kubectl: whole names for grep and awk (notes still wrap at 120)

    def _title(self, doc: GpuTopList) -> str:
        from gpuscale.model import rfc3339

        return f"Every {self.watch_interval:g}s: gpuscale top {doc.view}    {rfc3339(doc.generated_at)}"

    def show(self, doc: GpuTopList, *, problem: str | None = None) -> None:
        self._last = doc
        if problem:
            doc = doc.model_copy(update={"notes": [*doc.notes, problem]})
        options = RenderOptions(self.policy, self.scope, width=self._width(), headers=self.headers)
        rendered = render(doc, self.output, options)
        if self.structured:
            prefix = "---\n" if self.output == "yaml" and self.watch else ""
            self._write(prefix + rendered.plain())
        elif self.watch and self.terminal:
            from rich.console import Group
            from rich.live import Live
            from rich.text import Text

            frame = Group(Text(self._title(doc), style="dim"), rendered.rich_text())
            if self._live is None:
                self._live = Live(console=self.console, auto_refresh=False, redirect_stderr=False)
                self._live.start()
            self._live.update(frame, refresh=True)
        elif self.terminal:
            # NB: print() joins what it prints into a new Text that would wrap long rows at blanks: say no_wrap again
            self.console.print(rendered.rich_text(), end="", no_wrap=True, overflow="ellipsis")
        else:
            title = f"{self._title(doc)}\n\n" if self.watch and self.headers else ""
            self._write(("\n" if self._frames else "") + title + rendered.plain())
        self._frames += 1

    def problem(self, error: GpuscaleError) -> None:
        """A refresh after the first failed: keep the last frame, say why (or print to stderr)."""
        text = f"refresh failed: {error}"
        if self._last is not None and (self.terminal or not self.structured) and self.headers:
            self.show(self._last, problem=text)
        else:
            print(f"gpuscale top: {text}", file=sys.stderr, flush=True)

    @staticmethod
    def _write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


_T = TypeVar("_T")


async def unless_stopped(work: Awaitable[_T], stop: asyncio.Event) -> tuple[bool, _T | None]:
    """Run ``work`` unless ``stop`` is set first (then cancel it): (finished, result)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False, None
    return True, task.result()


async def show_frames(
    collector: Collector,
    screen: Screen,
    stop: asyncio.Event,
    *,
    sort_by: str | None,
    iterations: int | None,
) -> None:
    """One frame, or with ``screen.watch`` a frame every ``screen.watch_interval`` until ``stop`` or
    ``iterations``. The first refresh's error is raised; later ones are shown and watching goes on."""
    frames = 0
    while True:
        try:
            finished, doc = await unless_stopped(collector.collect(first=frames == 0), stop)
        except GpuscaleError as e:
            if frames == 0:
                raise
            screen.problem(e)
            finished, doc = True, None
        if not finished:
            break
        if doc is not None:
            screen.show(doc.model_copy(update={"items": sort_items(doc.view, doc.items, sort_by)}))
        frames += 1
        if not screen.watch or (iterations is not None and frames >= iterations):
            break
        gc.collect()  # NB: in the idle time between frames (see pipeline.cyclic_gc_paused)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), screen.watch_interval)
        if stop.is_set():
            break
