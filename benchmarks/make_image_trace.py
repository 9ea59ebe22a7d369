"""Write gpuscale/replay/data/text-to-image-2h.csv.gz: a synthetic service-time trace (see its README).

Synthetic, not measured: 2 hours of a text-to-image service whose request rate ramps from 1 to 6 per second
and back (a cosine over the 2 h, Poisson arrivals, timestamps rounded to the millisecond so some repeat),
service times lognormal with p50 1.2 s and p95 4 s (the magnitudes a user reported for one such service), and
a ``model`` per request: the base model ``sdxl`` for 70 % and three LoRA adapters for the rest (15/10/5 %).
Deterministic (seed 23): ``python benchmarks/make_image_trace.py`` rewrites the same bytes.
"""

from __future__ import annotations

import gzip
import io
import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).parents[1] / "gpuscale" / "replay" / "data" / "text-to-image-2h.csv.gz"


def main() -> None:
    rng = np.random.default_rng(23)
    span, peak, base = 7200.0, 6.0, 1.0
    # thinning of a Poisson process at the peak rate
    t = np.cumsum(rng.exponential(1 / peak, int(span * peak * 1.2)))
    t = t[t < span]
    rate = base + (peak - base) * (1 - np.cos(2 * math.pi * t / span)) / 2
    t = t[rng.random(len(t)) < rate / peak]
    mu, sigma = math.log(1.2), math.log(4.0 / 1.2) / 1.6448536269514722
    service = rng.lognormal(mu, sigma, len(t))
    models = rng.choice(["sdxl", "lora-anime", "lora-product", "lora-logo"], len(t), p=[0.7, 0.15, 0.1, 0.05])
    buf = io.StringIO()
    buf.write("timestamp,service_time,model\n")
    start = 1764806400.0  # 2025-12-04T00:00:00Z
    for ts, s, m in zip(t, service, models, strict=True):
        buf.write(f"{start + ts:.3f},{s:.3f},{m}\n")
    OUT.write_bytes(gzip.compress(buf.getvalue().encode(), compresslevel=9, mtime=0))
    print(f"{OUT}: {len(t)} requests")


if __name__ == "__main__":
    main()
