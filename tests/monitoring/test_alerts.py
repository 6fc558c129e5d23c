"""``monitoring/alerts.yml`` with Prometheus's own ``promtool``: the rules are valid, and each
alert fires on a bad series and stays silent on a healthy one (``alerts_test.yml``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus) is installed by scripts/bootstrap.sh"
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_rules_and_the_scrape_config_are_valid():
    for args in (("check", "rules", "alerts.yml"), ("check", "config", "prometheus.yml")):
        out = _promtool(*args, cwd=MONITORING)
        assert out.returncode == 0, out.stdout + out.stderr


def test_each_alert_fires_on_a_bad_series_and_not_on_a_healthy_one():
    out = _promtool("test", "rules", "alerts_test.yml", cwd=MONITORING)
    assert out.returncode == 0, out.stdout + out.stderr
    tested = (MONITORING / "alerts_test.yml").read_text()
    for line in (MONITORING / "alerts.yml").read_text().splitlines():
        if line.strip().startswith("- alert:"):
            assert f"alertname: {line.split(':')[1].strip()}," in tested  # every alert


@pytest.mark.parametrize(("rule", "loose"), [
    ("radix_global_decisions_total[10m])) > 0.2", "radix_global_decisions_total[10m])) > 0.001"),
    ("[30m])) < 0.5", "[30m])) < 0.95"),
])
def test_a_rule_that_would_fire_on_the_healthy_series_fails_the_test(tmp_path, rule, loose):
    """Negative control: loosened so that the healthy model alerts too, the test fails."""
    rules = (MONITORING / "alerts.yml").read_text()
    assert rule in rules
    (tmp_path / "alerts.yml").write_text(rules.replace(rule, loose))
    shutil.copy(MONITORING / "alerts_test.yml", tmp_path)
    out = _promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert out.returncode != 0 and "good" in out.stdout + out.stderr, out.stdout
