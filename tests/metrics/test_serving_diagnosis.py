"""Serving verdicts: what an LLM server's queue, batch and KV cache say next to its GPU's SM activity.

Thresholds come from policies/diagnosis.yaml (``serving:``, optional: the defaults are checked here too).
"""

from __future__ import annotations

import pytest
import yaml

from gpuscale.errors import ConfigError
from gpuscale.metrics.diagnosis import GpuSignals, ServingCode, ServingSignals, diagnose_serving, load_policy
from gpuscale.policy_files import DIAGNOSIS_FILE, policy_file

POLICY = load_policy()


@pytest.mark.parametrize(
    ("serving", "sm_active", "code"),
    [
        # KV cache full and requests preempted: the cache is the limit, whatever the queue or the SMs.
        (dict(queue_depth=12, batch_size=40, kv_cache_usage_percent=99, preemptions_per_second=0.5), 0.3, "kv"),
        # A queue while SMs are under-filled: the batch cap (max-num-seqs) binds, not the GPU.
        (dict(queue_depth=7, batch_size=32, kv_cache_usage_percent=40), 0.38, "batch"),
        # A queue on a busy GPU: scale out.
        (dict(queue_depth=7, batch_size=256, kv_cache_usage_percent=60), 0.9, "saturated"),
        # Nearly full, nothing preempted yet.
        (dict(queue_depth=0, batch_size=100, kv_cache_usage_percent=93), 0.6, "high"),
        # A full cache without preemption reported is "high", and a queue behind it is not "batch-limited".
        (dict(queue_depth=9, kv_cache_usage_percent=98), 0.3, "high"),
        # Nothing wrong; and no SM_ACTIVE means no batch verdict rather than a guess.
        (dict(queue_depth=0, batch_size=10, kv_cache_usage_percent=20), 0.2, None),
        (dict(queue_depth=7, batch_size=32), None, None),
        ({}, 0.3, None),
    ],
)
def test_serving_verdicts(serving, sm_active, code):
    codes = {
        "kv": ServingCode.KV_CACHE_FULL,
        "batch": ServingCode.BATCH_LIMITED,
        "saturated": ServingCode.SATURATED,
        "high": ServingCode.KV_CACHE_HIGH,
        None: None,
    }
    verdict = diagnose_serving(ServingSignals(**serving), GpuSignals(sm_active=sm_active), POLICY)
    assert (verdict.code if verdict else None) == codes[code]


def test_the_explanation_cites_the_numbers_and_the_policy_gives_the_next_step():
    verdict = diagnose_serving(
        ServingSignals(queue_depth=7, batch_size=32, kv_cache_usage_percent=40), GpuSignals(sm_active=0.38), POLICY
    )
    assert verdict.explanation == "7 requests wait at batch 32 while SMs are 38% active"
    assert "--max-num-seqs" in verdict.next_step and verdict.severity == "warning"


def test_thresholds_come_from_the_policy_file(tmp_path):
    data = yaml.safe_load(policy_file(DIAGNOSIS_FILE, None).read_text())
    data["serving"]["kv_cache_high_percent"] = 50
    (tmp_path / "diagnosis.yaml").write_text(yaml.safe_dump(data))
    policy = load_policy(tmp_path)
    verdict = diagnose_serving(ServingSignals(kv_cache_usage_percent=60), GpuSignals(), policy)
    assert verdict.code == ServingCode.KV_CACHE_HIGH
    data["serving"]["kv_cache_high_percent"] = 99
    (tmp_path / "diagnosis.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="kv_cache_high_percent"):
        load_policy(tmp_path)
