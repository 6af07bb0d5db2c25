"""Records read back into the types they were written from (``records.read``), with their
``schema_version``: a newer one refused naming it, an older one migrated, a record missing
a field refused naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from records import read, versions
from records.point import PointResult, PointStatus, RequestRecord, TurnRow
from records.read import RecordError, SchemaVersionError
from records.trace import TransferTraceRecord
from tests.unit.helpers import bench_record

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def a_point() -> PointResult:
    return PointResult(
        "pull-h0-r0-x",
        PointStatus.ok,
        "",
        "pull",
        {"deployment_id": "d", "topology": {"prefill": {"count": 1, "tp": 2}}},
        {"history_tokens": 512, "concurrency": 4, "conversations": 2},
        by_turn=[TurnRow(1, 2, 0.0, 64.0, 10.0, 11.0, 64, 0, 0, 0, paths={"pull": 2})],
        offered_load={"offered_rate": 2.0, "achieved_rate": 1.5, "kept_up": False},
    )


def test_every_record_reads_back_equal_to_what_was_written():
    p = a_point()
    back = read.point(json.loads(json.dumps(p.to_dict())))
    assert back == p and back.status is PointStatus.ok and isinstance(back.by_turn[0], TurnRow)
    assert back.deployment_view.topology.prefill.tp == 2
    assert back.workload_view.history_tokens == 512 and back.offered_view.kept_up is False
    r = RequestRecord(0, 2, "pull", 100, 80, [1, 2], 10.0, [1.0], 12.0, 0.5, path="pull")
    assert read.request(json.loads(json.dumps(asdict(r)))) == r
    t = TransferTraceRecord(op="READ", direction="P<-D", post_time=1.0, transfer_s=0.01)
    assert read.trace_line(asdict(t)) == t
    b = bench_record(gb_s=3.0)
    assert read.bench_record(json.loads(json.dumps(asdict(b)))) == b


def test_request_lines_written_before_they_carried_a_version_are_version_one():
    r = asdict(RequestRecord(0, 1, "agg", 3, 0, [4], 1.0, [], 2.0, 0.0))
    del r["schema_version"]
    assert read.request(r).schema_version == 1


def test_a_record_of_a_newer_pdbench_is_refused_naming_its_version():
    data = {**a_point().to_dict(), "schema_version": versions.POINT_SCHEMA + 1}
    with pytest.raises(SchemaVersionError) as info:
        read.point(data, "points/x.json")
    text = str(info.value)
    assert text.startswith(
        f"points/x.json: a point record of schema_version {data['schema_version']}"
    )
    assert "Fix: analyse it with the pdbench that recorded it" in text


def test_an_older_record_is_migrated_through_each_version(monkeypatch):
    steps = {
        1: lambda d: {**d, "error": d.pop("err", "")},  # a field renamed in version 2
        2: lambda d: {**d, "path": d.get("path") or "recompute"},  # a default in version 3
    }
    monkeypatch.setitem(versions.MIGRATIONS, "request", steps)
    old = asdict(RequestRecord(0, 1, "agg", 3, 0, [4], 1.0, [], 2.0, 0.0))
    old = {k: v for k, v in old.items() if k not in ("schema_version", "error")}
    now = versions.current("request", {**old, "err": "boom"}, 3)
    assert now["schema_version"] == 3 and now["error"] == "boom" and now["path"] == "recompute"


def test_a_record_missing_a_field_or_of_a_wrong_type_is_refused_naming_it():
    data = a_point().to_dict()
    del data["flow"]
    with pytest.raises(RecordError, match="missing required field `flow`"):
        read.point(data, "points/x.json")
    bad = {**a_point().to_dict(), "summary": {"requests": "many"}}
    with pytest.raises(RecordError, match=r"summary.requests"):
        read.point(bad)


def test_the_analysis_refuses_a_run_of_a_newer_pdbench_naming_the_version(tmp_path):
    run = tmp_path / "run"
    (run / "points").mkdir(parents=True)
    data = {**a_point().to_dict(), "schema_version": 9}
    (run / "points" / "p.json").write_text(json.dumps(data))
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", str(run), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "a point record of schema_version 9; this pdbench reads up to" in proc.stderr
    assert "Traceback" not in proc.stderr
