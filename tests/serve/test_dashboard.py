"""The Grafana dashboard reads only metrics the server exports, and carries the article's targets."""
import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import paged.serve

DASHBOARD = Path(paged.serve.__file__).parent / "grafana_dashboard.json"


def test_every_queried_metric_is_exported(server):
    server.post("/v1/completions", json={"prompt": "fill the histograms", "max_tokens": 3})
    server.post("/v1/completions", json={"prompt": "x", "top_p": 9})  # an error, so the error counter exists
    exported = {s.name for f in text_string_to_metric_families(server.get("/metrics").text) for s in f.samples}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queried = {name for p in panels for t in p["targets"] for name in re.findall(r"\b(?:vllm|paged):\w+", t["expr"])}
    assert len(queried) >= 15
    assert queried <= exported, queried - exported


def test_the_health_panels_carry_the_articles_thresholds():
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}

    def steps(prefix):
        panel = next(p for title, p in panels.items() if title.startswith(prefix))
        return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]

    assert steps("KV cache usage") == [None, 0.6, 0.9]
    assert steps("P99 end-to-end latency") == [None, 1]
    assert steps("Output tokens/s per GPU") == [None, 500]
    assert steps("Failed requests") == [None, 0.001]
