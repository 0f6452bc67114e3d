"""The local Prometheus config `cluster up --prometheus` writes (pure file output, no Prometheus run)."""

import json
import os

from gregor.cli import local_prometheus as lp


def test_file_sd_path_is_absolute_for_a_relative_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs(lp.prometheus_dir("rel-cluster"))
    config_path = lp.write_config("rel-cluster", 1.0, 9090, "gregor")
    with open(config_path) as f:
        config = json.load(f)
    files = config["scrape_configs"][0]["file_sd_configs"][0]["files"]
    # Prometheus reads this relative to the config's folder, so a relative path would miss targets.json.
    assert files == [str(tmp_path / "rel-cluster" / "prometheus" / "targets.json")]
    assert os.path.isabs(config["rule_files"][0])
