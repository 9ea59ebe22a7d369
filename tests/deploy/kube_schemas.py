"""kubernetes-validate's ``validate``, with each schema file it reads parsed once per process.

Its ``validate`` opens and parses the kind's schema and the 1.3 MB ``_definitions.json`` on every call, for every
object and Kubernetes version: most of a deploy variant's validation (20 objects × 2 versions: 0.67 s of CPU, 0.05 s
with the files parsed once). The parsed schemas are only read (jsonschema never changes a schema), so one copy
serves every call. Its errors are kubernetes-validate's own.
"""

from __future__ import annotations

import functools
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils


def validate(obj: dict[str, Any], version: str, *, strict: bool) -> str:
    """``kubernetes_validate.validate(obj, version, strict=strict)``, the schema files read once."""
    reader = kubernetes_validate.utils.schema_contents
    if not hasattr(reader, "cache_info"):
        kubernetes_validate.utils.schema_contents = functools.cache(reader)
    return kubernetes_validate.validate(obj, version, strict=strict)
