"""Memory-breakdown and scaling charts (SVG/PNG via matplotlib)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.report.charts import (
    memory_breakdown_gib,
    scaling_efficiency,
    scaling_series,
    write_memory_chart,
    write_scaling_chart,
)

GIB = 2**30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STAGES = [
    {"activations": (20 - 3 * i) * GIB, "weights": 10 * GIB, "gradients": 5 * GIB,
     "optimizer_states": 30 * GIB, "buffers": 2.5 * GIB, "reserve": 4 * GIB}
    for i in range(4)
]
POINTS = [(64, 1.4e6, 0.45), (8, 2.0e5, 0.52), (16, 3.9e5, 0.50), (512, 9.0e6, 0.37)]


def test_memory_breakdown_orders_and_converts() -> None:
    stages = [{"activations": GIB, "custom": 2 * GIB}, {"weights": 3 * GIB}]
    cats, gib, cap = memory_breakdown_gib(stages, 80 * GIB)
    assert cats == ["weights", "activations", "custom"]
    assert gib == [[0.0, 3.0], [1.0, 0.0], [2.0, 0.0]]
    assert cap == 80.0


@pytest.mark.parametrize(
    "stages,cap,field",
    [
        ([], 80 * GIB, "stages"),
        ({"weights": 1}, 80 * GIB, "stages"),
        ([{"weights": -1}], 80 * GIB, "stages[0]['weights']"),
        ([{"weights": float("nan")}], 80 * GIB, "stages[0]['weights']"),
        ([["weights", 1]], 80 * GIB, "stages[0]"),
        ([{"weights": 1}], 0, "capacity_bytes"),
    ],
)
def test_memory_breakdown_bad_input(stages, cap, field) -> None:
    with pytest.raises(InputError) as exc:
        memory_breakdown_gib(stages, cap)
    assert exc.value.field == field


def test_scaling_series_sorts_and_validates() -> None:
    gpus, tps, mfu = scaling_series(POINTS)
    assert gpus == [8, 16, 64, 512] and tps[0] == 2.0e5 and mfu[-1] == 0.37
    for bad in ([], [(0, 1.0, 0.5)], [(8, -1.0, 0.5)], [(8, 1.0, 1.5)], [(8, 1.0)], [(8, 1.0, 0.5), (8, 2.0, 0.4)]):
        with pytest.raises(InputError):
            scaling_series(bad)


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_memory_chart_writes(tmp_path: Path, suffix: str) -> None:
    out = write_memory_chart(STAGES, 80 * GIB, tmp_path / f"mem{suffix}")
    data = out.read_bytes()
    if suffix == ".png":
        assert data[:8] == PNG_MAGIC
    else:
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")
        assert b"capacity 80 GiB" in data and b"optimizer states" in data
    with pytest.raises(InputError):
        write_memory_chart(STAGES, 80 * GIB, out)
    write_memory_chart(STAGES, 80 * GIB, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"mem{suffix}"]


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_scaling_chart_writes(tmp_path: Path, suffix: str) -> None:
    out = write_scaling_chart(POINTS, tmp_path / f"scaling{suffix}")
    data = out.read_bytes()
    if suffix == ".png":
        assert data[:8] == PNG_MAGIC
    else:
        ET.fromstring(data)
        # every axis names its quantity and unit; the ideal line and the efficiency are drawn
        for label in (b"throughput (tokens/s, log scale)", b"GPUs (log2 scale)", b"percent (%)",
                      b"ideal (linear from 8 GPUs)", b"scaling efficiency vs ideal", b"MFU"):
            assert label in data, label


def test_scaling_efficiency_against_ideal_linear_scaling() -> None:
    ideal, eff = scaling_efficiency([8, 16, 64, 512], [2.0e5, 3.9e5, 1.4e6, 9.0e6])
    assert ideal == [2.0e5, 4.0e5, 1.6e6, 1.28e7]
    assert eff[0] == 1.0 and eff[1] == pytest.approx(0.975) and eff[3] == pytest.approx(9.0e6 / 1.28e7)
    with pytest.raises(InputError):
        scaling_efficiency([8, 16], [0.0, 1.0])


def test_svg_output_is_deterministic(tmp_path: Path) -> None:
    a = write_scaling_chart(POINTS, tmp_path / "a.svg").read_bytes()
    b = write_scaling_chart(POINTS, tmp_path / "b.svg").read_bytes()
    assert a == b


def test_unknown_suffix_rejected(tmp_path: Path) -> None:
    with pytest.raises(InputError) as exc:
        write_scaling_chart(POINTS, tmp_path / "scaling.jpg")
    assert exc.value.field == "path"
    with pytest.raises(InputError):
        write_memory_chart(STAGES, 80 * GIB, tmp_path / "mem")


def test_memory_chart_bars_add_up_to_each_stages_peak(tmp_path: Path) -> None:
    """`planner chart memory` draws every part of a stage's predicted peak, memory outside the
    allocator included (it drew 63.3 of a 66.6 GiB peak), and its title names every degree."""
    import json

    from planner.cli.pictures import _MEMORY_KEYS
    from tests.conftest import run_cli

    plan = tmp_path / "plan.json"
    code, out, err = run_cli(["plan", "--model", "llama3.1-8b", "--gpus", "16", "-b", "32", "--pp", "2", "--top", "1", "--json"])
    assert code == 0, err
    plan.write_text(out)
    pred = json.loads(out)["plans"][0]["predicted"]
    for s in pred["memory_by_stage"]:
        assert sum(s.get(k, 0.0) for k, _ in _MEMORY_KEYS) == pytest.approx(s["total_bytes"], rel=1e-9)
    code, out, err = run_cli(["chart", "memory", str(plan), "--out", str(tmp_path / "m.svg")])
    assert code == 0, err
    svg = (tmp_path / "m.svg").read_text()
    assert "outside the allocator" in svg and "dp=" in svg and "vpp=" in svg


def test_scaling_chart_says_why_efficiency_passes_100_percent(tmp_path: Path) -> None:
    """Llama 3.1 8B needs full recompute on 2 GPUs and none on 8: per-GPU throughput rises with
    the count (135%), and the command says why instead of leaving a >100% efficiency unexplained."""
    from tests.conftest import run_cli

    code, out, err = run_cli(["chart", "scaling", "--model", "llama3.1-8b", "--gpus", "2,8", "--out", str(tmp_path / "s.svg")])
    assert code == 0, err
    text = " ".join(out.split())
    assert "scaling efficiency above 100% (8 GPUs" in text and "full" in out and "rec" in out
