"""The smaller shapes a workload needing one GPU could take instead: a MIG profile, a cheaper GPU, a time-sliced
share (the rules in recommend.py's docstring). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from gpuscale.report.policy import Product, ReportPolicy
from gpuscale.report.schema import Recommendation

__all__ = ["HOURS_PER_MONTH", "OneGpuShape", "one_gpu_alternatives", "rounded"]

HOURS_PER_MONTH = 730.0


def rounded(x: float, digits: int = 2) -> float:
    return round(float(x), digits)


@dataclass(frozen=True, slots=True)
class OneGpuShape:
    """What a 1-GPU pod must keep on a smaller shape (MIG profile, smaller GPU, a time-sliced share)."""

    product: Product | None
    price: float | None
    requested: float
    avg_pods: float
    margin: float
    peak_gpu_fb: float
    fit_fb: float  # peak FB × (1 + margin), MiB
    share_safe: float  # the safety-percentile compute share
    share_target: float  # that + margin, at most 1

    def freed(self, share: float) -> tuple[float, float | None]:
        """(GPU-hours a month, their price) freed when each pod keeps ``1 - share`` of its GPU."""
        # NB: multiplied left to right in the order they always were, so the rounded figures stay the same
        hours = share * self.avg_pods * HOURS_PER_MONTH * min(self.requested, 1.0)
        if self.price is None:
            return hours, None
        return hours, self.price * share * self.avg_pods * HOURS_PER_MONTH * min(self.requested, 1.0)


def _mig_profile(shape: OneGpuShape, *, policy: ReportPolicy) -> Recommendation | None:
    """**MIG profile**: the smallest profile holding the memory and compute share needed."""
    rs, product, margin, share_target = policy.rightsizing, shape.product, shape.margin, shape.share_target
    if product is None:
        return None
    mig = _mig_fit(product, fb_mib=shape.fit_fb, share=share_target)
    if mig is None or mig.compute_share >= 1.0:
        return None  # NB: the whole GPU as a MIG profile saves nothing: not a recommendation
    freed_hours, saving = shape.freed(1 - mig.compute_share)
    return Recommendation(
        kind="mig-profile",
        severity="warning",
        short=f"mig {mig.profile}",
        summary=f"fits MIG {mig.profile} on {product.name}: peak FB {shape.peak_gpu_fb / 1024:.1f} GiB "
        f"(+{margin:.0%} = {shape.fit_fb / 1024:.1f} ≤ {mig.memory_mib / 1024:.1f} GiB), activity "
        f"p{rs.safety_percentile * 100:g} {shape.share_safe:.0%} (+{margin:.0%} = {share_target:.0%}) "
        f"≤ {mig.compute_share:.0%}",
        evidence={
            f"activity_p{rs.safety_percentile * 100:g}": rounded(shape.share_safe, 4),
            "fb_peak_mib": rounded(shape.peak_gpu_fb),
            "fb_needed_mib": rounded(shape.fit_fb),
            "profile_memory_mib": mig.memory_mib,
            "compute_share_target": rounded(share_target, 4),
            "profile_compute_share": rounded(mig.compute_share, 4),
            "resource": f"nvidia.com/mig-{mig.profile}",
            "gpu_hours_freed_per_month": rounded(freed_hours),
        },
        monthly_saving=rounded(saving) if saving is not None else None,
    )


def _smaller_gpu(shape: OneGpuShape, *, policy: ReportPolicy) -> Recommendation | None:
    """**smaller GPU**: the cheapest priced product holding the memory and the throughput needed."""
    rs, product, price, share_target = policy.rightsizing, shape.product, shape.price, shape.share_target
    smaller = _smaller_product(policy, product, fb_mib=shape.fit_fb, share=share_target, price=price)
    if smaller is None or product is None:
        return None
    cand, cand_price = smaller
    saving = (price - cand_price) * shape.avg_pods * HOURS_PER_MONTH if price is not None else None
    return Recommendation(
        kind="smaller-gpu",
        severity="warning",
        short=f"smaller-gpu {cand.name}",
        summary=f"a {cand.name} would do: peak FB {shape.peak_gpu_fb / 1024:.1f} GiB fits its "
        f"{cand.memory_mib / 1024:.0f} GiB; activity p{rs.safety_percentile * 100:g} "
        f"+{shape.margin:.0%} = {share_target:.0%} of a {product.name} is "
        f"{share_target * product.tflops / cand.tflops:.0%} of it",
        evidence={
            f"activity_p{rs.safety_percentile * 100:g}": rounded(shape.share_safe, 4),
            "fb_needed_mib": rounded(shape.fit_fb),
            "candidate_memory_mib": cand.memory_mib,
            "compute_share_target": rounded(share_target, 4),
            "tflops_now": product.tflops,
            "tflops_candidate": cand.tflops,
            "price_now": price,
            "price_candidate": cand_price,
        },
        monthly_saving=rounded(saving) if saving is not None else None,
    )


def _time_slicing(shape: OneGpuShape, *, policy: ReportPolicy) -> Recommendation | None:
    """**time-slicing**: when the compute share and memory leave room for enough such pods on one GPU."""
    rs, share_target = policy.rightsizing, shape.share_target
    gpu_memory = shape.product.memory_mib if shape.product else None
    pods_per_gpu = int(1.0 / share_target) if share_target > 0 else rs.time_slicing_min_pods
    if gpu_memory:
        pods_per_gpu = min(pods_per_gpu, int(gpu_memory // max(shape.fit_fb, 1.0)))
    if pods_per_gpu < rs.time_slicing_min_pods:
        return None
    freed_hours, saving = shape.freed(1 - 1 / pods_per_gpu)
    return Recommendation(
        kind="time-slicing",
        severity="info",
        short=f"time-slicing {pods_per_gpu}/GPU",
        summary=f"time-slicing candidate: {pods_per_gpu} such pods fit one GPU "
        f"(compute share {share_target:.0%}, peak FB {shape.peak_gpu_fb / 1024:.1f} GiB)",
        evidence={
            f"activity_p{rs.safety_percentile * 100:g}": rounded(shape.share_safe, 4),
            "compute_share_target": rounded(share_target, 4),
            "fb_needed_mib": rounded(shape.fit_fb),
            "gpu_memory_mib": gpu_memory,
            "pods_per_gpu": pods_per_gpu,
            "gpu_hours_freed_per_month": rounded(freed_hours),
        },
        monthly_saving=rounded(saving) if saving is not None else None,
    )


def one_gpu_alternatives(shape: OneGpuShape, *, policy: ReportPolicy) -> list[Recommendation]:
    """Every smaller shape that holds the workload, in the order the rules are tried."""
    return [r for rule in (_mig_profile, _smaller_gpu, _time_slicing) if (r := rule(shape, policy=policy))]


def _mig_fit(product: Product, *, fb_mib: float, share: float):
    fits = [m for m in product.mig if m.memory_mib >= fb_mib and m.compute_share >= share]
    return min(fits, key=lambda m: (m.compute_share, m.memory_mib)) if fits else None


def _smaller_product(policy: ReportPolicy, product: Product | None, *, fb_mib: float, share: float, price):
    if product is None or price is None:
        return None
    best = None
    for cand in policy.gpus.products:
        cand_price = policy.prices.per_gpu_hour(cand.name)
        if cand is product or cand_price is None or cand_price >= price:
            continue
        fits = cand.memory_mib >= fb_mib and share * product.tflops <= cand.tflops * policy.rightsizing.busy_share
        if fits and (best is None or cand_price < best[1]):
            best = (cand, cand_price)
    return best
