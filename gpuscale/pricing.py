"""What a GPU costs per hour, from ``policies/prices.yaml``: one table for the report and the controller.

Pure (no I/O beyond reading the policy file at load). A product no entry matches has no price (``None``): a
consumer shows GPU-hours without a cost rather than inventing one.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.config import Regex, read_yaml, validate
from gpuscale.policy_files import PRICES_FILE, policy_file

__all__ = ["PRICES_FILE", "PriceTable", "ProductPrice", "load_prices"]


class ProductPrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    match: Regex
    per_gpu_hour: float = Field(ge=0, allow_inf_nan=False)


class PriceTable(BaseModel):
    """Prices per GPU-hour, first matching entry wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    currency: str = Field(default="USD", min_length=1)
    products: tuple[ProductPrice, ...] = ()

    @cached_property
    def _compiled(self) -> tuple[tuple[re.Pattern[str], float], ...]:
        return tuple((re.compile(p.match, re.IGNORECASE), p.per_gpu_hour) for p in self.products)

    def per_gpu_hour(self, product: str | None) -> float | None:
        """Price of one GPU of ``product`` for one hour, or None when the product is unknown or unpriced."""
        if not product:
            return None
        for pattern, price in self._compiled:
            if pattern.fullmatch(product):
                return price
        return None


def load_prices(path_dir: str | Path | None = None) -> PriceTable:
    """``prices.yaml`` from ``path_dir`` when it holds one, else the shipped file; ConfigError names file and field."""
    path = policy_file(PRICES_FILE, path_dir)
    return validate(PriceTable, read_yaml(path), path)
