#!/usr/bin/env python3
"""Writes asyncps-dashboard.json, the Grafana dashboard of an asyncps fleet.

Every panel's PromQL is in PANELS below; tests/launch/monitoring_test.py runs each
query against a real Prometheus scraping a real fleet, so a renamed metric breaks
the test, not the dashboard. Import the JSON in Grafana (Dashboards > Import) and
pick the Prometheus data source that scrapes the fleet.
"""
import json
import os

# (title, unit, [(expr, legend)])
PANELS = [
    ("Throughput (samples/s)", "short", [
        ("sum(rate(asyncps_worker_samples_total[30s]))", "all workers"),
        ("rate(asyncps_worker_samples_total[30s])", "rank {{rank}}")]),
    ("Training loss", "short", [
        ("asyncps_worker_train_loss", "rank {{rank}}")]),
    ("Test accuracy", "percentunit", [
        ("asyncps_worker_test_accuracy >= 0", "rank {{rank}}")]),
    ("Staleness of applied pushes (quantiles)", "short", [
        ("histogram_quantile(0.5, sum by (le) (rate(asyncps_shard_staleness_bucket[1m])))",
         "p50"),
        ("histogram_quantile(0.99, sum by (le) (rate(asyncps_shard_staleness_bucket[1m])))",
         "p99")]),
    ("Pull wait", "s", [
        ("histogram_quantile(0.99, sum by (le) (rate(asyncps_shard_pull_wait_seconds_bucket[1m])))",
         "shard p99"),
        ("rate(asyncps_worker_pull_wait_seconds_total[1m])",
         "rank {{rank}} (fraction of time)")]),
    ("Worker clocks", "short", [
        ("max by (rank) (asyncps_shard_worker_clock)", "rank {{rank}}")]),
    ("Bytes pushed and pulled (B/s)", "Bps", [
        ("sum by (kind) (rate(asyncps_worker_pushed_bytes_total[1m]))", "pushed {{kind}}"),
        ("sum(rate(asyncps_worker_pulled_bytes_total[1m]))", "pulled")]),
    ("Compression ratio (raw / wire)", "short", [
        ("sum(rate(asyncps_worker_pushed_bytes_total{kind=\"raw\"}[1m])) / "
         "sum(rate(asyncps_worker_pushed_bytes_total{kind=\"wire\"}[1m]))", "fleet"),
        ("asyncps_worker_compression_ratio", "rank {{rank}}")]),
    ("Shard requests (per s)", "reqps", [
        ("sum by (kind) (rate(asyncps_shard_requests_total[1m]))", "{{kind}}")]),
    ("Rejected requests (per s)", "reqps", [
        ("sum by (reason) (rate(asyncps_shard_rejected_total[1m]))", "{{reason}}")]),
    ("Parked pulls", "short", [
        ("asyncps_shard_parked_pulls", "shard {{shard}}")]),
    ("Shard memory (bytes)", "bytes", [
        ("asyncps_shard_chunk_bytes", "weights, shard {{shard}}"),
        ("process_resident_memory_bytes{job=\"asyncps_server\"}", "RSS, shard {{shard}}")]),
]


def dashboard():
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for j, (expr, legend) in enumerate(targets)],
        })
    return {
        "title": "asyncps fleet",
        "uid": "asyncps-fleet",
        "tags": ["asyncps"],
        "schemaVersion": 36,
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "5s",
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }


def queries(doc):
    """Every PromQL expression of a dashboard document."""
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "asyncps-dashboard.json")
    with open(out, "w") as f:
        json.dump(dashboard(), f, indent=1)
        f.write("\n")
    print(out)
