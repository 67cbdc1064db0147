"""Prometheus metrics of the server, labelled by drafter (`none` when speculation is off).

Names follow vLLM's where one exists (time to first token, time per output token), prefixed
`draftsmith_`. μ over any window is `rate(draftsmith_completion_tokens_total) /
rate(draftsmith_target_forwards_total)`; the histogram gives its spread across requests. Each request counts
the forwards it took part in, so requests decoded together count a shared forward once each;
`draftsmith_batch_forwards_total` counts the forwards run. The mean batch size over any window is
`rate(draftsmith_batch_rows_total) / rate(draftsmith_batch_cycles_total)`; the queue's length is
`draftsmith_requests_waiting`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

if TYPE_CHECKING:
    from draftsmith.serve.server.engine import BatchStats

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
MU_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


class BatchCollector:
    """The engine's batch, read when /metrics is scraped: its size now, its slots, and its totals."""

    def __init__(self, drafter: str, read: Callable[[], "BatchStats"]):
        self.drafter = drafter
        self.read = read

    def collect(self) -> Iterator[Metric]:
        stats = self.read()
        gauges = [("draftsmith_batch_size", "Requests decoding together now (rows in the batch)", stats.running),
                  ("draftsmith_batch_size_max", "Rows the batch holds at most (serve.max_batch)", stats.max_batch),
                  ("draftsmith_batch_size_mean", "Mean rows per verify forward since the server started",
                   stats.mean_batch)]
        counters = [("draftsmith_batch_forwards", "Target forwards of the batch, prefills included", stats.forwards),
                    ("draftsmith_batch_cycles", "Verify forwards of the batch (one cycle of every running row each)",
                     stats.cycles),
                    ("draftsmith_batch_rows", "Rows summed over the verify forwards", stats.cycle_rows)]
        for name, text, value in gauges:
            metric = GaugeMetricFamily(name, text, labels=["drafter"])
            metric.add_metric([self.drafter], value)
            yield metric
        for name, text, value in counters:
            metric = CounterMetricFamily(name, text, labels=["drafter"])
            metric.add_metric([self.drafter], value)
            yield metric


class ServerMetrics:
    """One registry per app (tests start several servers in one process). batch: reads the engine's batch
    (Engine.batch_stats) at each scrape."""

    def __init__(self, drafter: str, *, batch: Callable[[], "BatchStats"] | None = None):
        self.drafter = drafter
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # resident memory, CPU seconds (Linux)
        r = self.registry
        self.requests = Counter("draftsmith_requests", "Requests by endpoint and outcome",
                                ["drafter", "endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("draftsmith_prompt_tokens", "Prompt tokens of finished requests",
                                     ["drafter"], registry=r)
        self.completion_tokens = Counter("draftsmith_completion_tokens", "Generated tokens of finished requests",
                                         ["drafter"], registry=r)
        self.target_forwards = Counter("draftsmith_target_forwards", "Target forwards of finished requests",
                                       ["drafter"], registry=r)
        self.accepted_tokens = Counter("draftsmith_accepted_tokens", "Accepted draft tokens",
                                       ["drafter"], registry=r)
        self.mu = Histogram("draftsmith_mu", "Tokens per target forward per request (bonus included)",
                            ["drafter"], buckets=MU_BUCKETS, registry=r)
        self.ttft = Histogram("draftsmith_time_to_first_token_seconds",
                              "Arrival to first generated token (queueing included)",
                              ["drafter"], buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("draftsmith_time_per_output_token_seconds",
                              "Mean time per generated token after the first, per request",
                              ["drafter"], buckets=TPOT_BUCKETS, registry=r)
        self.queue_seconds = Histogram("draftsmith_queue_seconds", "Arrival to start of generation",
                                       ["drafter"], buckets=TTFT_BUCKETS, registry=r)
        self.running = Gauge("draftsmith_requests_running", "Requests generating now", ["drafter"], registry=r)
        self.waiting = Gauge("draftsmith_requests_waiting", "Requests queued, not yet in the batch", ["drafter"],
                             registry=r)
        if batch is not None:
            r.register(BatchCollector(drafter, batch))

    def request(self, endpoint: str, status: str) -> None:
        self.requests.labels(self.drafter, endpoint, status).inc()

    def finished(self, *, prompt_tokens: int, completion_tokens: int, target_forwards: int,
                 accepted_tokens: int, mu: float, ttft: float | None, tpot: float | None,
                 queue_seconds: float | None) -> None:
        d = self.drafter
        self.prompt_tokens.labels(d).inc(prompt_tokens)
        self.completion_tokens.labels(d).inc(completion_tokens)
        self.target_forwards.labels(d).inc(target_forwards)
        self.accepted_tokens.labels(d).inc(accepted_tokens)
        if completion_tokens:
            self.mu.labels(d).observe(mu)
        if ttft is not None:
            self.ttft.labels(d).observe(ttft)
        if tpot is not None:
            self.tpot.labels(d).observe(tpot)
        if queue_seconds is not None:
            self.queue_seconds.labels(d).observe(queue_seconds)

    def render(self, *, running: int, waiting: int) -> bytes:
        self.running.labels(self.drafter).set(running)
        self.waiting.labels(self.drafter).set(waiting)
        return generate_latest(self.registry)
