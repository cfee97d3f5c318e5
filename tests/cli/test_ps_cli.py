"""``planner ps``: defaults (the shared default cluster), --json fields, --sweep table, chart files, bad input."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from planner.cli.app import main


def run(capsys, *args):
    code = main(["ps", *args])
    out, err = capsys.readouterr()
    return code, out, err


LAYOUTS = {"data-parallel", "table-wise", "column-wise", "row-wise", "table-row-wise", "ps-sync", "ps-quorum", "ps-ssp", "ps-async"}


def test_defaults_run_on_the_default_cluster_against_sharded_embeddings(capsys):
    from planner.cli.common import DEFAULTS

    code, out, err = run(capsys)
    assert code == 0, err
    assert "dlrm-criteo" in out and "recommend:" in out
    assert f"{DEFAULTS['gpus']} {DEFAULTS['gpu']} workers" in out and "8 per node" in out
    for layout in LAYOUTS:
        assert layout in out
    rec = out.split("recommend:")[1].splitlines()[0]
    assert "x ps-sync" in rec or "x the best sharding" in rec
    assert "1849" not in out and "still wins" in out  # no straw man; when a PS is the right call
    assert " GB " not in out and "GiB" in out  # one unit convention: sizes binary


def test_hosts_mode_keeps_the_chapter_model(capsys):
    code, out, err = run(capsys, "--gpu", "none", "--workers", "16", "--servers", "4")
    assert code == 0, err
    assert "16 workers x batch 2048" in out and "100 Gb/s ethernet" in out


def test_json_fields(capsys):
    code, out, _ = run(capsys, "--json", "--rows", "100000", "--zipf", "1.1", "--workers", "8", "--servers", "2",
                       "--replicas", "1", "--staleness", "2")
    assert code == 0
    d = json.loads(out)["result"]
    assert d["model"]["rows"] == 100_000 and d["model"]["zipf"] == 1.1
    assert d["cluster"]["workers"] == 8 and d["cluster"]["servers"] == 2 and d["cluster"]["replicas"] == 1
    assert set(d["layouts"]) == LAYOUTS
    for lay in d["layouts"].values():
        for f in ("step_s", "samples_per_s", "traffic_bytes_per_step", "worker_bytes_per_step",
                  "server_bytes_per_step", "server_bytes_per_s", "server_memory_bytes", "worker_memory_bytes", "fits"):
            assert f in lay
        assert lay["step_s"] > 0 and lay["samples_per_s"] > 0
    assert d["recommendation"] and d["reasons"] and d["unique_rows_per_worker"] > 0
    assert "hot_spot" in d and d["hot_replicas"] >= 1


def test_sweep_table_and_json(capsys):
    code, out, _ = run(capsys, "--sweep", "--model", "dlrm-kaggle")
    assert code == 0 and "crossover rows" in out and "s=1.5" in out and "best sharding" in out
    code, out, _ = run(capsys, "--sweep", "--json")
    sw = json.loads(out)["sweep"]
    assert len(sw["crossover_rows"]) == len(sw["zipf"])
    assert all(len(row) == len(sw["rows"]) for row in sw["winner"])
    assert {w for row in sw["winner"] for w in row} <= {"ps-sync", "sharded", "none"}
    assert "sharded" in {w for row in sw["winner"] for w in row}


@pytest.mark.parametrize("ext", ["svg", "png"])
def test_chart_written(capsys, tmp_path, ext):
    path = tmp_path / f"ps.{ext}"
    code, out, _ = run(capsys, "--chart", str(path), "--model", "dlrm-kaggle")
    assert code == 0 and path.exists() and "chart written" in out
    if ext == "svg":
        assert ET.parse(path).getroot().tag.endswith("svg")
    else:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args", [
    ["--workers", "0"], ["--zipf", "-1"], ["--rows", "0"], ["--model", "nope"], ["--replicas", "8"],
    ["--chart", "out.pdf"], ["--partition", "diagonal"], ["--quorum", "1.5"], ["--nic-gbps", "0"], ["--server-nic-gbps", "-1"], ["--gpu", "h100"],
])
def test_bad_input_exits_2_with_one_line(capsys, args):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:")
