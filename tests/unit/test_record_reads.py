"""Records are read back into their types: no string-key read of a record's field outside
the record readers (``records/``), so that a renamed field fails a test instead of turning
into a NaN in a report.

The check: every ``.get("<name>"`` in ``analysis/``, ``pdbench/driver/`` and ``jobs/`` whose
name is a field of a record type (``records.point``, ``records.trace``, ``records.bench``
and their views) is a finding, but those ``NOT_RECORDS`` lists: the same word read from
another JSON (an HTTP body, the manifest, a timing row), each with why. An entry no longer
needed fails too, so the list shrinks as the rest of the records get their types.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from records import bench, point, trace

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("analysis", "pdbench/driver", "jobs")
RECORD_TYPES = (
    point.PointResult,
    point.RequestRecord,
    point.Summary,
    point.LatencyStats,
    point.TurnRow,
    point.TransferTotals,
    point.DecodeBill,
    point.DeploymentView,
    point.WorkloadView,
    point.OfferedLoadView,
    point.TopologyView,
    point.RoleView,
    point.TransportView,
    point.ServerView,
    trace.TransferTraceRecord,
    bench.TransferRecord,
)
MANIFEST = "the manifest's config or traffic section: the run config's JSON, not a record"
HTTP = "an HTTP body of the OpenAI API or the router's own endpoints, not a record"
# file -> {word: why it is no record read}
NOT_RECORDS: dict[str, dict[str, str]] = {
    "analysis/questions/replay.py": {"path": MANIFEST},
    "analysis/questions/registry.py": {w: MANIFEST for w in ("name", "workload", "kind")},
    "analysis/whatif.py": {w: "the --what-if arguments" for w in ("model", "deployment")},
    "jobs/serving/client_commands.py": {"model": "the model section of a tokenizer.json"},
    "pdbench/driver/serve.py": {
        **{w: "serve/<deployment>.json, the serve record" for w in ("started_at", "deployment")},
        "model": "serve/<deployment>.json, the serve record",
        "flow": HTTP,
    },
    "jobs/measure/ttft_split.py": {
        w: "the connector's timing rows (timing/*.jsonl)" for w in ("request_id", "load_s")
    },
    "jobs/preflight/checks.py": {"nixl": "the node's package versions"},
    "jobs/preflight/spec.py": {"transfer": "the preflight spec file"},
    "jobs/request_stream.py": {w: HTTP for w in ("cached_tokens", "prompt_tokens")},
    "jobs/run/flags.py": {"expired_leases": "the router's /pdbench/stats answer"},
    "jobs/serving/openai_api.py": {"model": HTTP},
    "jobs/serving/router.py": {w: HTTP for w in ("flow", "cached_tokens")},
}
GET = re.compile(r"""\.get\(\s*["']([A-Za-z_0-9]+)["']""")


def record_fields() -> set[str]:
    return {f.name for t in RECORD_TYPES for f in dataclasses.fields(t)}


def string_key_reads(fields: set[str], repo: Path = REPO) -> dict[str, set[str]]:
    """File -> the record field names it reads with ``.get("name"``."""
    found: dict[str, set[str]] = {}
    for root in SCANNED:
        for path in sorted((repo / root).rglob("*.py")):
            words = {m.group(1) for m in GET.finditer(path.read_text())} & fields
            if words:
                found[str(path.relative_to(repo))] = words
    return found


def test_no_record_field_is_read_by_string_key_outside_the_record_readers():
    found = string_key_reads(record_fields())
    unexplained = {
        f"{path}: {word}"
        for path, words in found.items()
        for word in words
        if word not in NOT_RECORDS.get(path, {})
    }
    assert not unexplained, (
        "record fields read by string key (read the record into its type, records.read, "
        "and use its attributes):\n" + "\n".join(sorted(unexplained))
    )


def test_every_exception_is_still_needed():
    found = string_key_reads(record_fields())
    stale = {
        f"{path}: {word}"
        for path, words in NOT_RECORDS.items()
        for word in words
        if word not in found.get(path, set())
    }
    assert not stale, "no longer read: drop from NOT_RECORDS:\n" + "\n".join(sorted(stale))


def test_the_check_finds_a_planted_read(tmp_path):
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "planted.py").write_text('def f(p):\n    return p.get("ttft_ms")\n')
    found = string_key_reads(record_fields(), tmp_path)
    assert found == {"analysis/planted.py": {"ttft_ms"}}
