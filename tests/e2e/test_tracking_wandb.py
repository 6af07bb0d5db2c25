"""The real wandb library, offline: one run per Point, its summary and turn table on disk."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.tracking import Tracker, make_tracker
from pdbench.config.schema import TrackingBackend, TrackingConfig
from records.point import LatencyStats, PointResult, Summary, TransferTotals, TurnRow

pytestmark = pytest.mark.e2e

# The .wandb file is a LevelDB-style log (wandb-core's "store"): a 7-byte file header
# (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte header
# (crc32, length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4) holding a serialized Record proto.
BLOCK, HEADER = 32768, 7


def wandb_records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0)
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if left < HEADER or (length == 0 and kind == 0):  # block trailer / padding
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def summary_and_config(path: Path) -> tuple[dict, dict]:
    """The final summary and the config of one offline run, read with wandb's own protos."""
    from wandb.proto import wandb_internal_pb2 as pb

    summary: dict = {}
    config: dict = {}
    for raw in wandb_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        which = record.WhichOneof("record_type")
        if which == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                summary[key] = json.loads(item.value_json)
        elif which == "run":
            for item in record.run.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary, config


def synthetic_point() -> PointResult:
    return PointResult(
        point_id="pull-h0-0123456789",
        status="ok",
        error="",
        flow="pull",
        deployment={
            "deployment_id": "tiny_llama-1p1d-dram-t32-abcdef12",
            "model": {"name": "tiny_llama"},
            "topology": {"name": "1p1d"},
            "transport": {"name": "dram"},
        },
        workload={"kind": "multi_turn", "conversations": 4, "turns": 2, "history_tokens": 0},
        summary=Summary(
            ttft_ms=LatencyStats(p50=12.5, p90=20.0, p99=31.0, mean=14.0),
            itl_ms=LatencyStats(p50=3.0, p90=4.0, p99=5.0, mean=3.2),
            e2e_ms=LatencyStats(p50=60.0, p90=70.0, p99=80.0, mean=61.0),
            requests=8,
            output_tokens=128,
            duration_s=2.5,
            throughput_tok_s=51.2,
        ),
        by_turn=[
            TurnRow(
                turn=t,
                requests=4,
                history_tokens_mean=80.0 * (t - 1),
                prompt_tokens_mean=64.0 + 80.0 * (t - 1),
                ttft_ms_p50=10.0 + t,
                ttft_ms_mean=11.0 + t,
                prefill_tokens_computed=64.0,
                prefix_hit_tokens=0.0,
                tokens_pulled=80.0 * (t - 1),
                bytes_pulled=1024.0 * 80 * (t - 1),
                paths={"pull": 4} if t > 1 else {"recompute": 4},
            )
            for t in (1, 2)
        ],
        transfer=TransferTotals(bytes=327680.0, seconds=0.004, count=4.0),
    )


@pytest.fixture
def wandb_env(tmp_path, monkeypatch) -> Path:
    """Every W&B directory in tmp, no credentials, no mode forced from outside."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    for var, sub in (
        ("WANDB_DIR", "wandb_dir"),
        ("WANDB_CACHE_DIR", "wandb_cache"),
        ("WANDB_CONFIG_DIR", "wandb_config"),
        ("WANDB_DATA_DIR", "wandb_data"),
    ):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


def test_one_offline_run_per_point_with_summary_config_and_turn_table(wandb_env):
    run_dir = wandb_env / "results" / "smoke-test"
    tracker = make_tracker(TrackingConfig(backend=TrackingBackend.wandb), run_dir, "smoke-test")
    point = synthetic_point()
    config = {"name": "smoke-test", "model": {"name": "tiny_llama"}, "flow": {"flows": ["pull"]}}
    tracker.log_point(point, config)
    tracker.close()

    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    files = list(runs[0].glob("*.wandb"))
    assert len(files) == 1
    summary, run_config = summary_and_config(files[0])
    assert summary["ttft_ms/p50"] == 12.5
    assert summary["itl_ms/mean"] == 3.2
    assert summary["requests"] == 8
    assert summary["transfer/bytes"] == 327680.0
    assert summary["status"] == "ok"
    assert run_config["point_id"] == point.point_id
    assert run_config["flow"] == "pull"
    assert run_config["deployment"]["deployment_id"] == point.deployment["deployment_id"]
    assert run_config["workload"]["history_tokens"] == 0  # the Point's, not the sweep's
    assert run_config["name"] == "smoke-test"
    tables = list(runs[0].glob("files/media/table/by_turn_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"][0] == "turn" and len(table["data"]) == 2
    assert json.loads(table["data"][1][table["columns"].index("paths")]) == {"pull": 4}
    assert not (wandb_env / "wandb_dir" / "wandb").exists()  # runs go to the run dir


def test_each_point_gets_its_own_run(wandb_env):
    run_dir = wandb_env / "run"
    tracker = make_tracker(TrackingConfig(TrackingBackend.wandb, mode="offline"), run_dir, "run")
    for flow in ("agg", "pull"):
        point = synthetic_point()
        point.flow, point.point_id = flow, f"{flow}-h0-0123456789"
        tracker.log_point(point, {"name": "run"})
    tracker.close()
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 2


def test_none_backend_reports_nothing(tmp_path):
    tracker = make_tracker(TrackingConfig(), tmp_path, "x")
    assert type(tracker) is Tracker
    tracker.log_point(synthetic_point(), {})
    tracker.close()
    assert list(tmp_path.iterdir()) == []


def test_close_returns_once_w_and_b_has_written_everything(wandb_env):
    """``run.finish()`` returns before W&B's service has written the run's last records (a
    fresh-clone run once read the .wandb file 7 ms too early: no summary in it); the
    tracker's close waits for the service to end, so what it wrote is whole."""
    import psutil

    def services() -> list[str]:
        children = psutil.Process().children(recursive=True)
        return [" ".join(p.cmdline()) for p in children if "wandb" in " ".join(p.cmdline())]

    run_dir = wandb_env / "run"
    tracker = make_tracker(TrackingConfig(backend=TrackingBackend.wandb), run_dir, "run")
    tracker.log_point(synthetic_point(), {"name": "run"})
    assert services(), "no W&B service process: nothing to wait for"
    tracker.close()
    assert services() == []
    (log,) = run_dir.glob("wandb/offline-run-*/*.wandb")
    summary, _ = summary_and_config(log)
    assert summary["ttft_ms/p50"] == 12.5 and summary["status"] == "ok"
