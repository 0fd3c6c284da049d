"""Prometheus metrics of one process (SPEC §8), created against a registry the caller owns."""

from __future__ import annotations

from bisect import bisect_left as _bisect_left
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


# What /health/status answers (SPEC §8), one series each.
HEALTH_STATUSES = ("ready", "degraded", "draining", "unavailable")

# The label values each labelled series starts with, at 0 (issue 24 item 2; Prometheus'
# instrumentation guide, "avoid missing metrics"): a series that first appears at 1 shows no
# `increase()`, so the first event an alert waits for would fire nothing.
# tests/test_monitoring.py checks that the code counts no other literal value.
LEASE_RENEWAL_RESULTS = ("ok", "failed", "rejected", "late")  # shared/cluster/lease.py
ADMISSION_FAILURE_REASONS = ("full", "timed_out", "draining")  # shared/download/admission.py
TRANSFER_ABORT_REASONS = {
    # shared/download/: cut by the server, or lost by the client
    "download": (
        "send_timeout", "lease_lost", "process_failed", "pins_unwritable", "short_read",
        "storage_unavailable", "client_gone",
    ),
    "upload": ("receive_timeout", "min_rate"),  # shared/http/bodies.py's ReceiveTimedOut
}
STORAGE_READ_RESULTS = ("ok", "failed")  # shared/download/object_transfer.py


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # arkvory_http_requests_total and arkvory_http_request_duration_seconds: see RequestCounts.
        self.requests = RequestCounts()
        registry.register(self.requests)
        self.lease_renewals = Counter(
            "arkvory_lease_renewals",
            "Slot lease renewals by result (ok, failed, rejected, late)",
            ["result"],
            registry=registry,
        )
        self.lease_trust_remaining = Gauge(
            "arkvory_lease_trust_remaining_seconds",
            "Seconds this process may still trust its slot lease",
            registry=registry,
        )
        self.leases_lost = Counter(
            "arkvory_leases_lost", "Slot leases this process lost", registry=registry
        )
        self.payload_bytes = EventLoopCounter(
            "arkvory_download_payload_bytes",
            "Payload bytes of downloads handed to the network",
        )
        registry.register(self.payload_bytes)
        self.transfers_active = Gauge(
            "arkvory_downloads_active", "Downloads sending payload now", registry=registry
        )
        self.transfers_waiting = Gauge(
            "arkvory_downloads_waiting", "Downloads waiting for admission", registry=registry
        )
        self.admission_failures = Counter(
            "arkvory_download_admission_failures",
            "Downloads refused or abandoned before sending, by reason",
            ["reason"],
            registry=registry,
        )
        self.share_bytes_per_second = Gauge(
            "arkvory_download_share_bytes_per_second",
            "Configured payload rate of this process (scope=process) and per principal "
            "(scope=principal); 0 = unlimited",
            ["scope"],
            registry=registry,
        )
        self.short_reads = Counter(
            "arkvory_download_short_reads",
            "Downloads aborted because a blob on disk was shorter than its metadata",
            registry=registry,
        )
        self.transfer_aborts = Counter(
            "arkvory_transfer_aborts",
            "Transfers that ended before their last byte, by direction (download, upload) and "
            "reason: cut by the server (send_timeout, receive_timeout, min_rate, lease_lost, "
            "process_failed, pins_unwritable, short_read, storage_unavailable) or lost by the "
            "client (client_gone)",
            ["direction", "reason"],
            registry=registry,
        )
        self.policy_slots = Gauge(
            "arkvory_download_policy_slots",
            "Slots of the download policy this process runs under (0 = standalone, no policy)",
            registry=registry,
        )
        self.storage_available = Gauge(
            "arkvory_storage_available",
            "1 while this process's storage (the directory, or the object store) answers its "
            "probe, 0 while reads from it answer 503",
            registry=registry,
        )
        self.storage_reads = Counter(
            "arkvory_storage_read_requests",
            "Range requests sent to the object store for downloads, by result (ok, failed)",
            ["result"],
            registry=registry,
        )
        self.read_pins_write_age = Gauge(
            "arkvory_read_pins_write_age_seconds",
            "Seconds since the last committed write of this process's read pins was sent "
            "(refreshed every 2 s; past 8 s no payload is served)",
            registry=registry,
        )
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        for result in LEASE_RENEWAL_RESULTS:
            self.lease_renewals.labels(result=result)
        for reason in ADMISSION_FAILURE_REASONS:
            self.admission_failures.labels(reason=reason)
        for direction, reasons in TRANSFER_ABORT_REASONS.items():
            for reason in reasons:
                self.transfer_aborts.labels(direction=direction, reason=reason)
        for result in STORAGE_READ_RESULTS:
            self.storage_reads.labels(result=result)

    def observe_status(self, status_of: Callable[[], str]) -> None:
        """Export what /health/status answers, read at scrape time."""
        self.registry.register(_HealthStatusCollector(status_of))

    def observe_bandwidth(self, bandwidth) -> None:
        """Export the scheduler's own running totals instead of copying them per chunk."""
        self.registry.register(_BandwidthCollector(bandwidth))

    def observe_catalog(self, catalog) -> None:
        self.registry.register(_CatalogCollector(catalog))

    def observe_read_cache(self, cache) -> None:
        """Export the read cache's counters (shared/storage/read_cache.py), read at scrape time."""
        self.registry.register(_ReadCacheCollector(cache))

    # The lease reports through these two (see lease.RenewalCounter).
    def renewal(self, result: str) -> None:
        self.lease_renewals.labels(result=result).inc()

    def lost(self) -> None:
        self.leases_lost.inc()


class RequestCounts(Collector):
    """HTTP requests by method, route template and status, and their durations, exported as the
    counter `arkvory_http_requests_total` and the histogram
    `arkvory_http_request_duration_seconds` (prometheus_client's default buckets) that
    prometheus_client's own metrics would make, without their `_created` series.

    Counted with plain dict and list updates, one call per request: prometheus_client's labelled
    children took three locked increments and a Python loop over the buckets per request, 7 % of
    the instructions of an authorized 64 KiB download (issue 14 §3). No lock: only the event
    loop counts, and the scrape (shared/process/health.py) runs on the same loop. The keys are
    bounded by the caller (shared/http/edge.py: known methods, route templates, statuses)."""

    BOUNDS = tuple(Histogram.DEFAULT_BUCKETS)  # ends with +Inf

    def __init__(self) -> None:
        # route -> method -> [sum of seconds, count per bucket..., {status: count}]: plain
        # string and int keys (a tuple key is built and hashed on every request).
        self._routes: dict[str, dict[str, list]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        methods = self._routes.get(route)
        if methods is None:
            methods = self._routes[route] = {}
        timed = methods.get(method)
        if timed is None:
            timed = methods[method] = [0.0, *[0] * len(self.BOUNDS), {}]
        timed[0] += seconds
        # The first bucket whose upper bound is ≥ the value (`le` is inclusive).
        timed[1 + _bisect_left(self.BOUNDS, seconds)] += 1
        statuses = timed[-1]
        statuses[status] = statuses.get(status, 0) + 1

    def collect(self):
        requests = CounterMetricFamily(
            "arkvory_http_requests",
            "HTTP requests by method, route template and status",
            labels=["method", "route", "status"],
        )
        durations = HistogramMetricFamily(
            "arkvory_http_request_duration_seconds",
            "Time to answer an HTTP request (until the last body byte was handed over)",
            labels=["method", "route"],
        )
        bounds = [floatToGoString(bound) for bound in self.BOUNDS]
        for route, methods in list(self._routes.items()):
            for method, timed in list(methods.items()):
                for status, count in list(timed[-1].items()):
                    requests.add_metric([method, route, str(status)], count)
                cumulative, buckets = 0, []
                for bound, count in zip(bounds, timed[1:-1]):
                    cumulative += count
                    buckets.append((bound, cumulative))
                durations.add_metric([method, route], buckets, timed[0])
        yield requests
        yield durations


class EventLoopCounter(Collector):
    """A counter without labels that only the event loop increments (per payload chunk, per
    small download): `inc` is one addition, where prometheus_client's Counter checks and locks
    on every call. Exported as NAME_total."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def collect(self):
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)


class _BandwidthCollector(Collector):
    def __init__(self, bandwidth) -> None:
        self.bandwidth = bandwidth

    def collect(self):
        yield CounterMetricFamily(
            "arkvory_download_token_wait_seconds",
            "Time downloads spent waiting for bandwidth tokens",
            value=self.bandwidth.wait_seconds,
        )
        yield CounterMetricFamily(
            "arkvory_download_granted_bytes",
            "Payload bytes granted by this process's token buckets",
            value=self.bandwidth.granted_bytes,
        )


class _CatalogCollector(Collector):
    def __init__(self, catalog) -> None:
        self.catalog = catalog

    def collect(self):
        lookups = CounterMetricFamily(
            "arkvory_catalog_lookups",
            "Content lookups answered from the catalog cache (hit) or the database (miss)",
            labels=["result"],
        )
        lookups.add_metric(["hit"], self.catalog.hits)
        lookups.add_metric(["miss"], self.catalog.misses)
        yield lookups


class _ReadCacheCollector(Collector):
    def __init__(self, cache) -> None:
        self.cache = cache

    def collect(self):
        cache = self.cache
        requests = CounterMetricFamily(
            "arkvory_read_cache_requests",
            "Downloads of object-store blobs by what the read cache did: hit (its checked file was"
            " sent), miss (read behind the digest's fill, or behind its file's first-read check),"
            " bypass (not cached: larger than the limit, or no room beside files being read)",
            labels=["result"],
        )
        for result, count in cache.requests.items():
            requests.add_metric([result], count)
        yield requests
        fills = CounterMetricFamily(
            "arkvory_read_cache_fills",
            "Blobs fetched from the object store into the read cache, by result: ok, failed (the"
            " store or this disk failed), corrupt (the bytes did not match the digest)",
            labels=["result"],
        )
        for result, count in cache.fills.items():
            fills.add_metric([result], count)
        yield fills
        discards = CounterMetricFamily(
            "arkvory_read_cache_discards",
            "Cached files dropped because they changed since their hash was checked (changed) or"
            " failed the check of their bytes on the disk at their first read in this process,"
            " after their fill or a restart (corrupt); each is fetched again",
            labels=["reason"],
        )
        for reason, count in cache.discards.items():
            discards.add_metric([reason], count)
        yield discards
        yield CounterMetricFamily(
            "arkvory_read_cache_evictions", "Cached files evicted (least recently used) to stay within the limit",
            value=cache.evictions,
        )
        yield GaugeMetricFamily(
            "arkvory_read_cache_bytes", "Bytes the read cache holds, fills in progress included", value=cache.held,
        )
        yield GaugeMetricFamily(
            "arkvory_read_cache_limit_bytes", "The read cache's limit (ARKVORY_CACHE_MAX_BYTES)",
            value=cache.max_bytes,
        )
        yield GaugeMetricFamily("arkvory_read_cache_files", "Files in the read cache", value=cache.files)


class _HealthStatusCollector(Collector):
    def __init__(self, status_of: Callable[[], str]) -> None:
        self.status_of = status_of

    def collect(self):
        current = self.status_of()
        family = GaugeMetricFamily(
            "arkvory_health_status",
            "1 for the status /health/status answers now (ready, degraded, draining, unavailable), 0 for the others",
            labels=["status"],
        )
        for status in HEALTH_STATUSES:
            family.add_metric([status], 1.0 if status == current else 0.0)
        yield family
