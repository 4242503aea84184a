"""The router's own Prometheus metrics (`paged_router_*`), in a registry of its own per app, so
that several routers in one process (the tests) keep separate counts."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from .backends import Backend


class RouterMetrics:
    def __init__(self, backends: list[Backend]) -> None:
        self.registry = r = CollectorRegistry()
        self.routed = Counter("paged_router_routing_decisions", "Backends chosen by the routing policy (a retry "
                              "after a connect error is a second decision)", ["backend"], registry=r)
        self.requests = Counter("paged_router_requests", "Requests sent to a backend (with those that could not "
                                "connect)", ["backend"], registry=r)
        self.errors = Counter("paged_router_errors", "Forwarding failures: connect (retried elsewhere), retried (the "
                              "connection broke before an answer: sent once more, elsewhere), interrupted (the "
                              "backend failed mid-request: 502), status (the backend answered 5xx)",
                              ["backend", "reason"], registry=r)
        self.rejected = Counter("paged_router_rejected", "Requests answered by the router itself: bad_request "
                                "(4xx: malformed, too large, no such route), no_backend (503) or internal_error "
                                "(500)", ["reason"], registry=r)
        healthy = Gauge("paged_router_backend_healthy", "1 while the backend is in service", ["backend"], registry=r)
        outstanding = Gauge("paged_router_backend_outstanding", "Requests this router has in flight there",
                            ["backend"], registry=r)
        kv_usage = Gauge("paged_router_backend_kv_usage", "The backend's last scraped KV cache usage (0..1)",
                         ["backend"], registry=r)
        for b in backends:
            healthy.labels(b.url).set_function(lambda b=b: float(b.healthy))
            outstanding.labels(b.url).set_function(lambda b=b: b.in_flight)
            kv_usage.labels(b.url).set_function(lambda b=b: b.scraped_kv_usage)
