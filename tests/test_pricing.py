"""The price table: first matching entry wins, unknown products have no price, bad files name file and field."""

import itertools

import pytest

from gpuscale.errors import ConfigError
from gpuscale.pricing import load_prices


def test_shipped_table_prices_known_products_by_gfd_and_dcgm_names() -> None:
    table = load_prices()
    assert table.per_gpu_hour("NVIDIA-H100-80GB-HBM3") == table.per_gpu_hour("NVIDIA H100 80GB HBM3")
    # The 80 GB A100 entry comes before the generic one.
    assert table.per_gpu_hour("NVIDIA-A100-SXM4-80GB") != table.per_gpu_hour("NVIDIA-A100-SXM4-40GB")
    assert table.per_gpu_hour("Tesla V100-SXM2-16GB") is None
    assert table.per_gpu_hour(None) is None


# Within a product line, a newer generation or the same GPU with more memory lists higher (issue 34: the shipped
# table put the H200, an H100 with 141 GB, below the H100). Names as GPU Feature Discovery and DCGM report them.
SXM_LINE = [  # B200 > H200 > H100 > A100 80 GB > A100 40 GB
    ("NVIDIA-B200", "NVIDIA B200"),
    ("NVIDIA-H200", "NVIDIA H200"),
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3"),
    ("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
    ("NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),
]
PCIE_LINES = [  # Ada 48 GB > Ada 24 GB > Turing 16 GB; Ampere 24 GB > Turing 16 GB
    [("NVIDIA-L40S", "NVIDIA L40S"), ("NVIDIA-L4", "NVIDIA L4"), ("Tesla-T4", "Tesla T4")],
    [("NVIDIA-A10G", "NVIDIA A10G"), ("Tesla-T4", "Tesla T4")],
]


@pytest.mark.parametrize("line", [SXM_LINE, *PCIE_LINES], ids=["sxm", "ada-turing", "ampere-turing"])
def test_shipped_prices_follow_generation_and_memory_within_a_line(line) -> None:
    table = load_prices()
    prices = []
    for gfd, dcgm in line:
        price = table.per_gpu_hour(gfd)
        assert price is not None and price == table.per_gpu_hour(dcgm), (gfd, dcgm)
        prices.append((price, gfd))
    for (higher, a), (lower, b) in itertools.pairwise(prices):
        assert higher > lower, f"{a} at {higher}/GPU-h is not above {b} at {lower}"


def test_directory_overrides_the_shipped_table(tmp_path) -> None:
    (tmp_path / "prices.yaml").write_text("currency: EUR\nproducts:\n  - {match: '.*', per_gpu_hour: 2.5}\n")
    table = load_prices(tmp_path)
    assert (table.currency, table.per_gpu_hour("Tesla V100-SXM2-16GB")) == ("EUR", 2.5)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("products:\n  - {match: '(', per_gpu_hour: 1}\n", "products[0].match"),
        ("products:\n  - {match: 'x', per_gpu_hour: -1}\n", "products[0].per_gpu_hour"),
        ("products:\n  - {match: 'x', price: 1}\n", "products[0]"),
    ],
)
def test_bad_table_names_file_and_field(tmp_path, body: str, named: str) -> None:
    (tmp_path / "prices.yaml").write_text(body)
    with pytest.raises(ConfigError) as e:
        load_prices(tmp_path)
    assert "prices.yaml" in str(e.value) and named in str(e.value)
