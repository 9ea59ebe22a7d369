"""The price table: first matching entry wins, unknown products have no price, bad files name file and field."""

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
