"""The four flows on one deployment: decode_first takes both of its paths and, like every
flow, gives agg's greedy tokens."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import load_points, outputs_by_turn, run_pdbench, server_pids

pytestmark = pytest.mark.e2e


def test_decode_first_takes_both_paths_and_matches_agg(tmp_path):
    run_dir = tmp_path / "run"
    # one repetition (the preset runs 3): a pipeline test, premises off
    args = ["+experiment=flows", "workload.repetitions=1", "launch.check_premises=false"]
    proc = run_pdbench([*args, f"dir={run_dir}"], 1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    points = load_points(run_dir)
    assert set(points) == {"agg", "recompute", "pull", "decode_first"}
    paths: dict[str, int] = {}
    for row in points["decode_first"]["by_turn"]:
        for path, n in row["paths"].items():
            paths[path] = paths.get(path, 0) + n
    assert paths.get("decode_first", 0) > 0, paths  # D served turns alone ...
    assert set(paths) - {"decode_first"}, paths  # ... and fell back on others
    agg = outputs_by_turn(run_dir, points["agg"])
    for flow in ("recompute", "pull", "decode_first"):
        assert outputs_by_turn(run_dir, points[flow]) == agg, flow
    assert server_pids(run_dir) == []
