"""One named ConfigMap kept current by list+watch, handed to a callback as its ``data``.

The same loop as every cache here (``reflector.Reflector``: list, watch from its resourceVersion, 410 → relist,
backoff honouring Retry-After), over a list selecting the one name by field, so the API sends nothing else. The
adapter's delegated authentication (adapter/auth_config.py) reads ``kube-system/extension-apiserver-authentication``
this way: a CA rotation applies without a restart. Needs ``list`` and ``watch`` on that ConfigMap.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from gpuscale.sources.reflector import Reflector, WatchedKind

__all__ = ["ConfigMapWatch"]

log = logging.getLogger(__name__)

KIND = "configmaps"


class ConfigMapWatch(Reflector):
    """``namespace/name``'s ``data`` passed to ``on_data`` at each list and change; None when it is deleted or
    absent (an absent one is logged as a warning, ending with ``missing_note`` when given)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        name: str,
        on_data: Callable[[Mapping[str, str] | None], None],
        missing_note: str = "",
        watch_timeout_seconds: int = 300,
        backoff_max_seconds: float = 30,
    ) -> None:
        super().__init__(watch_timeout_seconds=watch_timeout_seconds, backoff_max_seconds=backoff_max_seconds)
        self.namespace, self.configmap = namespace, name
        self._on_data = on_data
        self._missing_note = missing_note
        # NB: the partial carries the namespace and the selector into the watch requests too (watch_events).
        list_call = functools.partial(
            client.CoreV1Api(api_client).list_namespaced_config_map, namespace, field_selector=f"metadata.name={name}"
        )
        self._kinds = (WatchedKind(KIND, list_call, self._replace, self._put, self._remove),)

    @property
    def last_error(self) -> str | None:
        """The loop's last error (cleared by the next successful list or watch); for readiness messages."""
        return self.last_errors.get(KIND)

    def _replace(self, items: list[dict[str, Any]]) -> None:
        if not items:
            note = f": {self._missing_note}" if self._missing_note else ""
            log.warning("ConfigMap %s/%s not found%s", self.namespace, self.configmap, note)
        self._on_data(items[0].get("data") if items else None)

    def _put(self, obj: dict[str, Any]) -> None:
        self._on_data(obj.get("data") or {})

    def _remove(self, obj: dict[str, Any]) -> None:
        self._on_data(None)
