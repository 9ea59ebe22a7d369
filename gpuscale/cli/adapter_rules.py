"""What `gpuscale adapter` decides before it wires anything: the files and flags it checks, and the interval rules.

``check_start`` reads every file a flag names before the composition (cli/adapter.py) connects or listens, so a bad
one ends the start in one line. The interval rules derive every wait, history and read deadline from
``--refresh-interval``, so they change together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpuscale.adapter.auth_config import flag_parts
from gpuscale.adapter.tls import ServerTLS, serving_cert_files
from gpuscale.errors import ConfigError
from gpuscale.metrics.catalogue import Catalogue, load_catalogue
from gpuscale.model import ObjectRef, format_duration
from gpuscale.policy_files import check_policies_dir
from gpuscale.settings import AdapterSettings
from gpuscale.sources.promapi import check_credentials
from gpuscale.sources.targets import parse_scrape_targets

# NB: the adapter's logger, as before this moved out of cli/adapter.py: the log line names the same source.
log = logging.getLogger("gpuscale.cli.adapter")


# --- the interval rules ---------------------------------------------------------------------------------------


def retry_after_seconds(settings: AdapterSettings) -> int:
    """What a 503 tells the HPA controller to wait before asking again: one refresh, at least a second."""
    return max(1, round(settings.refresh_interval))


def asked_for_wait_seconds(settings: AdapterSettings) -> float:
    """How long a request for a scope not fetched yet waits: one refresh (whose reads are bounded by the interval,
    ``read_timeout``) that may have just begun, then the one that fetches it, plus its build."""
    return 2 * settings.refresh_interval + 5


def scrape_history_seconds(settings: AdapterSettings, catalogue: Catalogue) -> float:
    """How far back the scrape source keeps samples: the catalogue's longest rate window plus two refreshes, so a
    window is always full when the refresh that reads it runs late."""
    return catalogue.longest_window + 2 * settings.refresh_interval


def read_timeout(flag: str, timeout: float, settings: AdapterSettings) -> float:
    """A read may not outlast the refresh it belongs to; say so when a timeout the user gave is cut."""
    interval = settings.refresh_interval
    # NB: the adapter's exporter and Prometheus groups default as the groups do, so a timeout set is one given
    if timeout > interval and flag.removeprefix("--").replace("-", "_") in settings.given():
        log.warning(
            "%s %s is longer than --refresh-interval %s: reads time out after %s",
            flag,
            format_duration(timeout),
            format_duration(interval),
            format_duration(interval),
        )
    return min(timeout, interval)


# --- the checks before the start ------------------------------------------------------------------------


@dataclass
class CheckedStart:
    """What the start reads from files and flags before it connects or listens anywhere."""

    catalogue: Catalogue
    explicit: dict[str, ObjectRef | None]
    server_tls: ServerTLS | None


def check_start(settings: AdapterSettings, catalogue: Catalogue | None) -> CheckedStart:
    """Every file a flag names, read before anything connects or listens: a bad one ends the start (one line, exit 2)
    instead of surfacing after --insecure-port already serves, or as a first refresh that never works."""
    if settings.files.policies:
        check_policies_dir(settings.files.policies)
    catalogue = catalogue or load_catalogue(settings.files.config, policies=settings.files.policies)
    explicit = parse_scrape_targets(settings.scrape_url)
    if not explicit and not settings.discover_exporters and not settings.prometheus.url:
        raise ConfigError(
            "give at least one --scrape-url (an exporter /metrics URL), --discover-exporters or --prometheus-url"
        )
    check_credentials(settings.prometheus)
    server_tls: ServerTLS | None = None
    if settings.https_port is not None:
        flag_parts(settings.authentication)
        files = serving_cert_files(
            cert_file=settings.tls_cert_file, key_file=settings.tls_private_key_file, cert_dir=settings.cert_dir
        )
        server_tls = ServerTLS(files.cert_file, files.key_file)
    return CheckedStart(catalogue, explicit, server_tls)
