"""``--export FILE`` / ``--from FILE``: a fetched History as one NumPy ``.npz`` file, and back.

Format ``gpuscale.history/v1`` (docs/report.md), columnar: one array per DCGM field, all GPUs × all steps.

    meta            a JSON string: format, start, step_seconds, steps, source, gaps, gpus [{key, node, product,
                    mig_profile}], fields, pods [[namespace, name]], owners [[namespace, pod, kind, name, source]],
                    requests [[namespace, pod, gpus]], startups [[namespace, pod, seconds]] (optional),
                    node_pools {node: pool}
    pod             int32[gpus, steps]   index into meta.pods; -1 = no pod held the GPU
    <field>         float32[gpus, steps] one per field in meta.fields (NaN = no sample)

Why ``.npz`` and not Parquet: NumPy is already a core dependency, the format is NumPy's own documented,
stable one (``numpy.lib.format``, readable without gpuscale: ``np.load(f)["sm_active"]``), loading never
unpickles (``allow_pickle=False``: a file from elsewhere cannot run code), and the container image, which carries
only core dependencies, can write it; Parquet would add pyarrow (~55 MB installed) for the same arrays.
Written compressed (``savez_compressed``): idle GPUs' constant runs shrink well.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuscale.errors import ConfigError, one_line
from gpuscale.metrics.history import FIELDS, History, Owner, PodRef, clean
from gpuscale.sources.history_fetch import GridBudget

FORMAT = "gpuscale.history/v1"


def export_history(history: History, path: str | Path) -> None:
    fields = sorted({f for g in history.gpus for f in g.values})
    meta = {
        "format": FORMAT,
        "start": history.start,
        "step_seconds": history.step_seconds,
        "steps": history.steps,
        "source": history.source,
        "gaps": history.gaps,
        "gpus": [
            {"key": g.key, "node": g.node, "product": g.product, "mig_profile": g.mig_profile} for g in history.gpus
        ],
        "fields": fields,
        "pods": [[p.namespace, p.name] for p in history.pods],
        "owners": [[p.namespace, p.name, o.kind, o.name, o.source] for p, o in history.owners.items()],
        "requests": [[p.namespace, p.name, v] for p, v in history.requests.items()],
        "startups": [[p.namespace, p.name, v] for p, v in history.startups.items()],
        "node_pools": history.node_pools,
    }
    arrays: dict[str, np.ndarray] = {
        "meta": np.array(json.dumps(meta)),
        "pod": np.stack([g.pod for g in history.gpus]) if history.gpus else np.zeros((0, history.steps), np.int32),
    }
    for f in fields:
        arrays[f] = np.stack([g.values.get(f, history.empty_field()) for g in history.gpus])
    try:
        with open(path, "wb") as out:
            np.savez_compressed(out, **arrays)
    except OSError as e:
        raise ConfigError(f"--export {path}: {e.strerror or e}") from e


_MAX_META_CHARS = 16 * 1024 * 1024  # the JSON metadata: names of GPUs, pods and owners; a week of 10k GPUs is ~5 MB
_LATEST_START = 1e10  # epoch seconds (year 2286): later is no timestamp a report can print


class _Gpu(BaseModel):
    model_config = ConfigDict(extra="ignore")
    key: str
    node: str
    product: str | None = None
    mig_profile: str | None = None


class _Meta(BaseModel):
    """What ``meta`` must hold; a file from elsewhere is checked here once, so the report can trust it."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    start: float = Field(ge=0, le=_LATEST_START)
    step_seconds: float = Field(gt=0)
    steps: int = Field(ge=1)
    source: str | None = None
    gaps: list[str] = []
    gpus: list[_Gpu]
    fields: list[Literal[tuple(FIELDS)]]  # type: ignore[valid-type]
    pods: list[tuple[str, str]]
    owners: list[tuple[str, str, str, str, str]]
    requests: list[tuple[str, str, float]]
    startups: list[tuple[str, str, float]] = []
    node_pools: dict[str, str]


def _headers(path: str | Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's shape and dtype from its .npy header, read without reading (or inflating) its data."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                else:
                    raise ValueError(f"{info.filename}: .npy format {version} (1.0 or 2.0 expected)")
            out[info.filename.removesuffix(".npy")] = (tuple(shape), dtype)
    return out


def _check_arrays(headers: dict[str, tuple[tuple[int, ...], np.dtype]], fields: list[str]) -> tuple[int, int]:
    """(GPUs, steps) of the file's arrays, which must be a short string ``meta``, an integer ``pod`` and one
    float array per field, all GPUs × steps; ValueError naming the array otherwise."""
    shape, dtype = headers.get("meta", ((-1,), np.dtype(object)))
    if shape != () or dtype.kind != "U" or dtype.itemsize > 4 * _MAX_META_CHARS:
        raise ValueError(f"meta is not a JSON string of at most {_MAX_META_CHARS // 2**20} MiB ({dtype}{shape})")
    if "pod" not in headers:
        raise ValueError("no pod array")
    grid, dtype = headers["pod"]
    if len(grid) != 2 or dtype.kind not in "iu":
        raise ValueError(f"pod is {dtype}{grid}, expected integers [gpus, steps]")
    for name in fields:
        if name not in headers:
            raise ValueError(f"no {name} array, though meta.fields names it")
        shape, dtype = headers[name]
        if shape != grid or dtype.kind != "f":
            raise ValueError(f"{name} is {dtype}{shape}, expected floats {grid} (as pod)")
    return grid[0], grid[1]


def load_history(path: str | Path, *, memory_budget_bytes: int = 1536 * 1024 * 1024) -> History:
    """The History in ``path``; ConfigError naming the file and what is wrong with it. Headers and metadata are
    checked, and the grid against ``memory_budget_bytes``, before any array is read."""
    try:
        if not Path(path).is_file():  # NB: is_zipfile answers False for a missing file, too
            raise ConfigError(f"--from {path}: {'a directory' if Path(path).is_dir() else 'no such file'}")
        # NB: np.load reads a file that is neither .npz nor .npy as a pickle and says so, which is no help
        if not zipfile.is_zipfile(path):
            raise ConfigError(f"--from {path}: not a gpuscale history file (not an .npz archive; see --export)")
        headers = _headers(path)
        with np.load(path, allow_pickle=False) as data:
            if "meta" not in headers:
                raise ValueError("no meta array")
            gpus, steps = _check_arrays(headers, [])
            raw = json.loads(str(data["meta"]))
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
                raise ConfigError(f"--from {path}: format {found!r}, expected {FORMAT!r}")
            meta = _Meta.model_validate(raw)
            _check_arrays(headers, meta.fields)
            if (gpus, steps) != (len(meta.gpus), meta.steps):
                raise ConfigError(f"--from {path}: pod array shape {(gpus, steps)} does not match the metadata")
            # NB: +1 array per GPU: one column is read whole before its rows are kept
            GridBudget(limit_bytes=memory_budget_bytes, steps=steps).check(
                gpus=gpus, arrays=gpus * (len(meta.fields) + 1), fields=len(meta.fields), what=f"--from {path}"
            )
            return _history(meta, data, path)
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError(f"--from {path}: no such file") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"--from {path}: not a gpuscale history file (meta.{where}: {first['msg']})") from None
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ConfigError(
            f"--from {path}: not a gpuscale history file ({type(e).__name__}: {one_line(str(e))})"
        ) from None


def _history(meta: _Meta, data: Any, path: str | Path) -> History:
    h = History(
        start=meta.start,
        step_seconds=meta.step_seconds,
        steps=meta.steps,
        source=f"{path} (exported from {meta.source or 'unknown'})",
        gaps=list(meta.gaps),
        pods=[PodRef(ns, name) for ns, name in meta.pods],
        owners={PodRef(ns, pod): Owner(kind, name, src) for ns, pod, kind, name, src in meta.owners},
        requests={PodRef(ns, pod): v for ns, pod, v in meta.requests},
        startups={PodRef(ns, pod): v for ns, pod, v in meta.startups},
        node_pools=meta.node_pools,
    )
    pods = data["pod"]
    unknown = (pods < -1) | (pods >= len(meta.pods))
    if unknown.any():
        # NB: a step whose pod index names no pod is a step no pod is known to have held, not a crash
        h.gaps.append(f"{int(unknown.sum())} step(s) in {path} name a pod index not in meta.pods: counted as no pod")
        pods = np.where(unknown, -1, pods)
    for i, g in enumerate(meta.gpus):
        gpu = h.new_gpu(g.key, node=g.node, product=g.product, mig_profile=g.mig_profile)
        gpu.pod = pods[i].astype(np.int32)
    for name in meta.fields:
        column = data[name]
        for gpu, row in zip(h.gpus, column, strict=True):
            values = clean(row)  # NB: ±Inf and DCGM blanks in a file are no samples, as from a server
            if not np.isnan(values).all():
                gpu.values[name] = values
    return h
