"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

from gpuscale.metrics.catalogue import load_catalogue


@pytest.fixture
def catalogue():
    return load_catalogue()
