"""deploy/prometheus-alerts.yml: the README's alerts as Prometheus rules. Every metric a rule
reads is one /metrics exports (a renamed metric leaves a rule that never fires), and every
label it groups by is one that metric has."""

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from routing_project import metrics

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus-alerts.yml"
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


@pytest.mark.django_db
def test_every_alert_reads_metrics_and_labels_that_metrics_exports(make_group, post_lead):
    group, _ = make_group(1)
    post_lead(group=group.slug)  # the labelled counters have a series
    # A labelled counter has no sample before its first event: its label names are its own.
    declared = {
        m._name: set(m._labelnames)  # noqa: SLF001
        for m in vars(metrics).values()
        if isinstance(m, MetricWrapperBase)
    }
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(APIClient().get("/metrics").content.decode()):
        labels = exported.setdefault(family.name, set(declared.get(family.name, ())))
        for sample in family.samples:
            labels.update(k for k in sample.labels if k != "le")
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    assert len(rules) == 7
    for rule in rules:
        assert rule["alert"].startswith("LeadRouter") and rule["annotations"]["summary"]
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), expr
        names = set(re.findall(r"\bleadrouter_\w+", expr))
        assert names, expr
        for name in names:
            base = next(
                (name.removesuffix(s) for s in SUFFIXES if name.endswith(s) and name.removesuffix(s) in exported), name
            )
            assert base in exported, (rule["alert"], name)
            grouped = re.findall(r"by \(([^)]*)\)", expr)
            wanted = {label.strip() for labels in grouped for label in labels.split(",")} - {"le"}
            assert wanted <= exported[base], (rule["alert"], wanted, exported[base])
            for label in re.findall(r"\{(\w+)=", expr):
                assert label in exported[base], (rule["alert"], label)
