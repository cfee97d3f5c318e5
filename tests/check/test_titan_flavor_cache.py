"""torchtitan flavor shapes are read from the installed torchtitan once and then from a cache
file per torchtitan and planner version (importing torchtitan's registry takes seconds); a cache
that cannot be read is ignored."""

from __future__ import annotations

import json

import pytest

from planner.check import titan_flavors as tf

pytestmark = pytest.mark.skipif(not tf.titan_available(), reason="torchtitan is not installed")


def test_the_second_reading_comes_from_the_cache_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    tf.flavor_shape.cache_clear()
    first = tf.flavor_shape("llama3", "8B", 8192)
    path = tf._cache_file()
    assert path.parent == tmp_path and path.is_file()
    assert json.loads(path.read_text())["llama3/8B/8192"] == first
    assert (first["layers"], first["hidden"], first["heads"], first["kv_heads"]) == (32, 4096, 32, 8)

    def no_torchtitan(*a, **k):
        raise AssertionError("read torchtitan again")

    monkeypatch.setattr(tf, "_read_flavor", no_torchtitan)
    tf.flavor_shape.cache_clear()
    assert tf.flavor_shape("llama3", "8B", 8192) == first


def test_an_unreadable_cache_is_read_around(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    tf.flavor_shape.cache_clear()
    path = tf._cache_file()
    path.write_text("{not json")
    got = tf.flavor_shape("llama3", "8B", 4096)
    assert got["layers"] == 32 and json.loads(path.read_text())["llama3/8B/4096"] == got
    tf.flavor_shape.cache_clear()
