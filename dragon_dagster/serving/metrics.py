"""/metrics in Prometheus' text format, on prometheus_client: requests by status, time to first token, output
tokens per second, the queue, the version each name serves, and model loads that failed (a hot swap kept the old
version)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # the *_created series double every counter's lines for a timestamp nobody graphs

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dragon_serve_requests",
            "Chat completion requests by HTTP status and version",
            ["status", "version"],
            registry=r,
        )
        self.ttft = Histogram(
            "dragon_serve_time_to_first_token_seconds",
            "From request to first token",
            ["version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens_per_s = Histogram(
            "dragon_serve_output_tokens_per_second",
            "A reply's tokens over its decode time",
            ["version"],
            buckets=RATE_BUCKETS,
            registry=r,
        )
        self.output_tokens = Counter("dragon_serve_output_tokens", "Reply tokens generated", ["version"], registry=r)
        self.queue = Gauge("dragon_serve_queue_depth", "Requests waiting for a place in a batch", registry=r)
        self.in_flight = Gauge("dragon_serve_requests_in_flight", "Requests being answered", registry=r)
        self.served = Gauge(
            "dragon_serve_model_version",
            "The version each name resolves to (value: the version)",
            ["name", "alias"],
            registry=r,
        )
        self.load_failures = Counter(
            "dragon_serve_model_load_failures",
            "Versions that failed to load (the old one kept serving)",
            ["name", "version"],
            registry=r,
        )
        self.feedback = Counter(
            "dragon_serve_feedback", "Ratings received over HTTP", ["version", "rating"], registry=r
        )

    def text(self) -> bytes:
        return generate_latest(self.registry)
