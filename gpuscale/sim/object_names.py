"""Deterministic names and UIDs of the simulated cluster's objects, as Kubernetes would spell them.

Everything here depends only on its arguments (the scenario's seed among them), never on ``hash()`` or the
clock, so two processes given the same scenario agree on every GPU UUID, pod name and object UID. Deployment
pods are ``<deploy>-<pod-template-hash>-<5 chars>`` (hash and suffix drawn from the apimachinery "safe"
alphabet), StatefulSet pods ``<sts>-<ordinal>``.
"""

from __future__ import annotations

import hashlib
import uuid

__all__ = ["gpu_uuid", "name_suffix", "object_uid", "template_hash"]

# apimachinery util/rand: the alphabet of pod-name suffixes and of SafeEncodeString (pod-template-hash).
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _digest(*parts: object, size: int = 16) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=size).digest()


def object_uid(*parts: object) -> str:
    """A deterministic, valid version-4 UUID string for ``parts``."""
    return str(uuid.UUID(bytes=_digest("uid", *parts), version=4))


def gpu_uuid(seed: int, node: str, index: int) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, deterministic in (seed, node, index)."""
    h = _digest("gpu", seed, node, index).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def template_hash(*parts: object) -> str:
    """Like ``rand.SafeEncodeString(fmt.Sprint(uint32 hash))``: 9–10 chars of ``[4-9bcdf]``."""
    number = int.from_bytes(_digest("hash", *parts, size=4), "big")
    return "".join(_SAFE_ALPHABET[ord(ch) % len(_SAFE_ALPHABET)] for ch in str(number))


def name_suffix(*parts: object, length: int = 5) -> str:
    """Like ``rand.String(5)``: a pod-name suffix from the safe alphabet."""
    data = _digest("suffix", *parts, size=length)
    return "".join(_SAFE_ALPHABET[b % len(_SAFE_ALPHABET)] for b in data)
