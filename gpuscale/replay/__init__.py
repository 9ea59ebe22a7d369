"""The what-if simulator (a consumer): replay request traces or metric histories through real HPA manifests.

    traces.py    request traces (Azure LLM CSV, Mooncake JSONL, plain CSV) with errors naming file/line/field
    serving.py   replicas with continuous batching behind a least-outstanding balancer; what they report
    signals.py   the adapter's view of those replicas (catalogue metrics, refresh delay) for gpuscale.hpa
    simulate.py  the loop: serving model + HPA every 15 s + Deployment scale (start-up delay, draining)
    results.py   GPU-hours, queue-time percentiles, SLO minutes, timeline, events; the JSON schema

Uses gpuscale.hpa and the metric catalogue; never the adapter or the CLI.
"""
