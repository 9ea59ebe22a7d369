"""The seam sources implement, re-exported from the pure core (gpuscale/metrics/series.py), which owns it."""

from gpuscale.metrics.series import HealthReporter, MetricsSource, SeriesValue, TargetHealth, TermQuery, series_value

__all__ = ["HealthReporter", "MetricsSource", "SeriesValue", "TargetHealth", "TermQuery", "series_value"]
