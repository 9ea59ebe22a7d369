"""``pods/{name}/proxy``: a GET passed on to the pod's IP, as kube-apiserver passes it."""

from __future__ import annotations

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from gpuscale.sim.api_errors import (
    NOT_ALLOWED,
    ApiStatusError,
    not_found,
)
from gpuscale.sim.kubeapi.storage import ObjectStore
from gpuscale.sim.resources import (
    BY_PATH,
)


async def proxy_to_pod(
    request: web.Request, store: ObjectStore, namespace: str, target: str, path: str
) -> web.StreamResponse:
    """``pods/{[scheme:]name[:port]}/proxy/{path}``: the request passed on to the pod's IP, as kube-apiserver
    does (``kubectl get --raw``, ``gpuscale top --discover-exporters``). Unlike kube-apiserver, a loopback pod
    IP is allowed: every simulated pod listens on loopback."""
    if request.method != "GET":
        raise NOT_ALLOWED
    parts = target.split(":")
    scheme = parts.pop(0) if len(parts) == 3 else "http"
    name, port = parts[0], (parts[1] if len(parts) > 1 else "")
    rt = BY_PATH[("", "v1", "pods")]
    pod = store.stored(rt, namespace, name)
    if pod is None:
        raise not_found(rt, name)
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        raise ApiStatusError(503, "ServiceUnavailable", f"pod {name} does not have a host assigned")
    if not port:
        ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
        port = str(ports[0]["containerPort"]) if ports else "80"
    elif not port.isdigit():  # NB: a named port, as kube-apiserver resolves it
        named = {
            p.get("name"): p.get("containerPort")
            for c in (pod.get("spec") or {}).get("containers") or []
            for p in c.get("ports") or []
        }
        if port not in named:
            raise ApiStatusError(503, "ServiceUnavailable", f'no container port named "{port}" in pod {name}')
        port = str(named[port])
    host = f"[{ip}]" if ":" in ip else ip
    url = f"{scheme}://{host}:{port}{path}"
    try:
        async with (
            ClientSession(timeout=ClientTimeout(total=30)) as session,
            session.get(url, params=request.query) as resp,
        ):
            body = await resp.read()
            content_type = resp.headers.get("Content-Type", "text/plain")
            return web.Response(body=body, status=resp.status, headers={"Content-Type": content_type})
    except (ClientError, TimeoutError) as e:
        raise ApiStatusError(
            503, "ServiceUnavailable", f"error trying to reach service: {str(e) or type(e).__name__}"
        ) from None
