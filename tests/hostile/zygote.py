"""A fork server for tests/hostile/limits.run_cli: one child imports gpuscale and its heavy dependencies once,
then forks a grandchild per command line, which sets its own memory cap and runs the CLI's main().

Why: the hostile suite runs a few hundred command lines, each under a cap of its own. A fresh interpreter per
line spends 1-2 s importing numpy, pydantic and aiohttp before doing anything (most of the suite's time on a
loaded 2-core machine); a fork after the imports costs milliseconds and isolates each line just the same (its
own address space, cap, file descriptors, exit status and rusage). The grandchild's stdout and stderr are
files at the fd level, so whatever writes there (print, logging, a C library) is captured as a user sees it.

Protocol on stdin/stdout, one JSON object per line each way: a request {argv, seconds, cap, stdin (base64 or
null), cwd, env} and a reply {code (null: killed at the time limit), seconds, peak, out, err}.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import resource
import sys
import tempfile
import time
import traceback

# Imported before any fork, so each command line starts with them loaded, as a warm `gpuscale` would be.
PRELOAD = (
    "numpy",
    "yaml",
    "pydantic",
    "aiohttp",
    "gpuscale.cli.main",
    "gpuscale.settings",
    "gpuscale.cli.simulate",
    "gpuscale.cli.report",
    # the servers' and top's own (~2.5 s together): most of test_files' cases start one of them
    "kubernetes_asyncio",
    "gpuscale.sources.kube",
    "gpuscale.cli.top",
    "gpuscale.cli.adapter",
    "gpuscale.cli.controller",
)


def _child(request: dict, out_fd: int, err_fd: int, in_fd: int) -> None:
    """In the forked grandchild: never returns."""
    code = 1
    try:
        os.dup2(in_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(request["env"])
        if request["cwd"]:
            os.chdir(request["cwd"])
        cap = request["cap"]
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        from gpuscale.cli.main import main

        try:
            result = main(request["argv"])
            code = result if isinstance(result, int) else 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve_one(request: dict) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
        if request["stdin"] is not None:
            inp.write(base64.b64decode(request["stdin"]))
            inp.flush()
            inp.seek(0)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(request, out.fileno(), err.fileno(), inp.fileno())
        deadline = start + request["seconds"]
        code: int | None = None
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                _, _, usage = os.wait4(pid, 0)
                break
            time.sleep(0.01)  # polling a child's exit, not waiting on readiness
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return {
            "code": code,
            "seconds": seconds,
            "peak": usage.ru_maxrss * 1024,
            "out": out.read().decode(errors="replace"),
            "err": err.read().decode(errors="replace"),
        }


def serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(_serve_one(json.loads(line))), flush=True)


if __name__ == "__main__":
    serve()
