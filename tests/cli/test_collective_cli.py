"""``planner collective``: --json fields, the --sweep table, and bad input (exit 2, one line)."""

from __future__ import annotations

import json

import pytest

import planner.cli  # noqa: F401  (registers the commands)
from planner.cli.app import app, main
from planner.cli.collective import parse_size, parse_sweep, sweep_sizes
from planner.errors import InputError


def run(capsys, *args):
    # typer runs a lone registered command without its name; with several it is a group.
    group = bool(app.registered_callback or app.registered_groups or len(app.registered_commands) > 1)
    code = main((["collective"] if group else []) + list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_fields(capsys):
    code, out, err = run(capsys, "allreduce", "--size", "1GiB", "--gpu", "h100-sxm5-80gb", "--gpus", "8", "--json")
    assert code == 0, err
    d = json.loads(out)
    for key in ("op", "bytes", "gpus", "algorithm", "time_s", "algbw_gbps", "busbw_gbps"):
        assert key in d
    assert (d["op"], d["bytes"], d["gpus"], d["algorithm"]) == ("allreduce", 2**30, 8, "nvls")
    assert d["algbw_gbps"] == pytest.approx(d["bytes"] / d["time_s"] / 1e9)
    assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * 2 * 7 / 8)


def test_json_multi_node_and_algorithm(capsys):
    code, out, err = run(capsys, "allgather", "--size", "512MB", "--gpu", "a100-sxm4-80gb", "--gpus", "32",
                         "--nic-gbps", "200", "--nics-per-node", "4", "--algorithm", "ring", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert (d["bytes"], d["algorithm"], d["nodes"]) == (512 * 10**6, "ring", 4)
    assert d["levels"] == ["nvswitch", "infiniband:network"]


def test_sweep_table_plain_when_piped(capsys):
    code, out, err = run(capsys, "allreduce", "--sweep", "8:1GiB", "--gpu", "a100-sxm4-80gb", "--gpus", "8")
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if "busbw" in line)
    for col in ("size", "count", "type", "time (us)", "algbw", "busbw", "algorithm"):
        assert col in header
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert len(rows) == 28  # 8 B .. 1 GiB doubling: 2^3 .. 2^30
    assert rows[0][:3] == ["8", "2", "float"]
    assert rows[-1][0] == str(2**30)
    assert float(rows[-1][5]) == pytest.approx(230, rel=0.15)  # busbw, GB/s


def test_sweep_json(capsys):
    code, out, _ = run(capsys, "reducescatter", "--sweep", "1M:8M", "--gpu", "h100-sxm5-80gb", "--gpus", "8", "--json")
    assert code == 0
    assert [r["bytes"] for r in json.loads(out)["rows"]] == [2**20, 2**21, 2**22, 2**23]


@pytest.mark.parametrize(
    "args, field",
    [
        (["allreducex", "--size", "1GiB", "--gpu", "h100-sxm5-80gb", "--gpus", "8"], "OP"),
        (["allreduce", "--size", "-5", "--gpu", "h100-sxm5-80gb", "--gpus", "8"], "--size"),
        (["allreduce", "--size=-1GiB", "--gpu", "h100-sxm5-80gb", "--gpus", "8"], "--size"),
        (["allreduce", "--size", "1GiB", "--gpu", "h100-nonesuch", "--gpus", "8"], "--gpu"),
        (["allreduce", "--size", "1GiB", "--gpu", "h100-sxm5-80gb", "--gpus", "8", "--algorithm", "magic"], "--algorithm"),
        (["allreduce", "--size", "1GiB", "--gpu", "a100-sxm4-80gb", "--gpus", "8", "--algorithm", "nvls"], "algorithm"),
        (["allreduce", "--sweep", "1GiB:8", "--gpu", "h100-sxm5-80gb", "--gpus", "8"], "--sweep"),
        (["allreduce", "--size", "1GiB", "--gpu", "h100-sxm5-80gb", "--gpus", "0"], "--gpus"),
    ],
)
def test_bad_input_exit_2_one_line(capsys, args, field):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {field}")


def test_parse_size():
    assert parse_size("1073741824") == 2**30
    assert parse_size("1GiB") == parse_size("1G") == 2**30
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("64KiB") == 65536
    with pytest.raises(InputError):
        parse_size("1.5B")
    assert parse_sweep("8:1GiB") == (8, 2**30)
    assert sweep_sizes(8, 64) == [8, 16, 32, 64]


def test_default_cluster_like_plan(capsys):
    """No --gpu/--gpus: the default cluster every command shares (64 H100 in 8 nodes)."""
    from planner.cli.common import DEFAULTS

    code, out, err = run(capsys, "allreduce", "--size", "1GiB", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert (d["gpu"], d["gpus"], d["nodes"]) == (DEFAULTS["gpu"], DEFAULTS["gpus"], 8)
    code, out, err = run(capsys, "allreduce", "--size", "1GiB", "--gpus", "8")
    assert code == 0, err
    assert "(1 node;" in out and "1.00 GiB" in out and " ms" in out
