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
from pathlib import Path

import numpy as np

from gpuscale.errors import ConfigError
from gpuscale.metrics.history import History, Owner, PodRef

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


def load_history(path: str | Path) -> History:
    """The History in ``path``; ConfigError naming the file and what is wrong with it."""
    try:
        if not Path(path).is_file():  # NB: is_zipfile answers False for a missing file, too
            raise ConfigError(f"--from {path}: {'a directory' if Path(path).is_dir() else 'no such file'}")
        # NB: np.load reads a file that is neither .npz nor .npy as a pickle and says so, which is no help
        if not zipfile.is_zipfile(path):
            raise ConfigError(f"--from {path}: not a gpuscale history file (not an .npz archive; see --export)")
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != FORMAT:
                raise ConfigError(f"--from {path}: format {meta.get('format')!r}, expected {FORMAT!r}")
            h = History(
                start=float(meta["start"]),
                step_seconds=float(meta["step_seconds"]),
                steps=int(meta["steps"]),
                source=f"{path} (exported from {meta.get('source') or 'unknown'})",
                gaps=list(meta.get("gaps", [])),
                pods=[PodRef(ns, name) for ns, name in meta["pods"]],
                owners={PodRef(ns, pod): Owner(kind, name, src) for ns, pod, kind, name, src in meta["owners"]},
                requests={PodRef(ns, pod): float(v) for ns, pod, v in meta["requests"]},
                startups={PodRef(ns, pod): float(v) for ns, pod, v in meta.get("startups", [])},
                node_pools=dict(meta["node_pools"]),
            )
            pods = data["pod"]
            columns = {f: data[f] for f in meta["fields"]}
            if pods.shape != (len(meta["gpus"]), h.steps):
                raise ConfigError(f"--from {path}: pod array shape {pods.shape} does not match the metadata")
            for i, g in enumerate(meta["gpus"]):
                gpu = h.new_gpu(g["key"], node=g["node"], product=g.get("product"), mig_profile=g.get("mig_profile"))
                gpu.pod = pods[i].astype(np.int32)
                for f, col in columns.items():
                    if not np.isnan(col[i]).all():
                        gpu.values[f] = col[i].astype(np.float32)
            return h
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError(f"--from {path}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise ConfigError(f"--from {path}: not a gpuscale history file ({type(e).__name__}: {e})") from None
