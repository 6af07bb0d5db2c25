"""validate(): flags pdbench manages, CPU memory, run directories (issue 15's inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdbench.cli import compose_job
from pdbench.config.schema import Command
from pdbench.plan.deployments import make_plan
from pdbench.spec.serve_command import serve_command
from pdbench.spec.server_flags import FLAG_SOURCES, managed_flags
from pdbench.validate import capacity
from pdbench.validate.rules import ConfigProblem, validate
from tests.unit.helpers import cpu_run, llama3_8b

pytestmark = pytest.mark.unit


def lines_for(cfg, field: str) -> list[str]:
    return [str(p) for p in validate(cfg) if p.field == field]


def with_extra_args(*args: str):
    cfg = cpu_run()
    cfg.server.extra_args = list(args)
    return cfg


def test_extra_args_may_not_repeat_flags_pdbench_sets():
    cfg = with_extra_args("--tensor-parallel-size", "2", "--port=9000", "--max-num-batched-tokens")
    tp, port = lines_for(cfg, "server.extra_args")
    assert tp.startswith("server.extra_args=--tensor-parallel-size: repeats a flag pdbench sets")
    assert "Fix: drop it from server.extra_args and set the topology's tp" in tp
    assert port.startswith("server.extra_args=--port: repeats a flag pdbench sets itself")
    assert port.endswith("set server.base_port")


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("-tp", "(vLLM reads it as --tensor-parallel-size)"),  # vLLM's short name
        ("--max_num_seqs", "(vLLM reads it as --max-num-seqs)"),  # underscores read as dashes
        ("--tensor-parallel", "(vLLM reads it as --tensor-parallel-size)"),  # abbreviation
        ("--no-enforce-eager", "set server.enforce_eager"),  # the negated twin: same value
    ],
)
def test_other_spellings_of_a_managed_flag_are_caught(flag, said):
    (line,) = lines_for(with_extra_args(flag, "1"), "server.extra_args")
    assert line.startswith(f"server.extra_args={flag}: repeats a flag pdbench sets itself")
    assert said in line


def test_flags_pdbench_does_not_set_pass():
    cfg = with_extra_args("--max-num-batched-tokens", "512", "--disable-log-stats", "-O0")
    assert lines_for(cfg, "server.extra_args") == []


def test_the_managed_flags_are_the_ones_the_command_line_has():
    cfg = cpu_run()
    managed = managed_flags(cfg)
    plan = make_plan(cfg)
    for dep in plan.deployments:
        for inst in dep.instances:
            cmd = serve_command(dep, inst, "/m", "127.0.0.1", "python")
            assert {t for t in cmd if t.startswith("--")} <= managed
    assert set(FLAG_SOURCES) <= managed  # every hint names a flag still emitted


def test_a_context_larger_than_the_cpu_kv_cache_is_refused():
    cfg = cpu_run(model=llama3_8b())
    (line,) = lines_for(cfg, "server.cpu_kvcache_space_gb")
    assert line.startswith(
        "server.cpu_kvcache_space_gb=1: cannot hold one sequence of model.max_model_len=131072 "
        "tokens of llama3_8b (128 KiB of KV per token: 16.0 GiB"
    )
    assert "Fix: server.cpu_kvcache_space_gb=17, or model.max_model_len=8160 (or less)" in line


def test_the_kv_bound_is_vllm_s_one_sequence_plus_one_block():
    cfg = cpu_run(model=llama3_8b())
    cfg.model.max_model_len = 8160  # 255 blocks of 32 + 1 held back = 1 GiB at 128 KiB/token
    assert lines_for(cfg, "server.cpu_kvcache_space_gb") == []
    cfg.model.max_model_len = 8161
    assert len(lines_for(cfg, "server.cpu_kvcache_space_gb")) == 1
    cfg.server.cpu_kvcache_space_gb = 2
    assert lines_for(cfg, "server.cpu_kvcache_space_gb") == []


def test_no_cpu_kv_cache_is_refused():
    cfg = cpu_run()
    cfg.server.cpu_kvcache_space_gb = 0
    (line,) = lines_for(cfg, "server.cpu_kvcache_space_gb")
    assert "leaves vLLM-CPU no KV cache" in line and line.endswith("Fix: 1 or more")


def test_servers_that_do_not_fit_this_machine_are_refused(monkeypatch):
    monkeypatch.setattr(capacity, "machine_memory_bytes", lambda: 24 * capacity.GIB)
    cfg = cpu_run(model=llama3_8b())
    cfg.model.max_model_len = 8192
    cfg.server.cpu_kvcache_space_gb = 2
    (line,) = lines_for(cfg, "model")
    assert line.startswith(
        "model=llama3_8b: needs 33.9 GiB (weights ~15.0 GiB in bfloat16 x 2 servers + 2 GiB "
        "KV cache x 2 TP ranks), more than this machine's 24.0 GiB"
    )
    # every TP rank holds its own KV cache; the weights are split, not repeated
    cfg.topology.decode.tp = 2
    cfg.server.cpu_share_cores = True
    monkeypatch.setattr(capacity, "machine_memory_bytes", lambda: 35 * capacity.GIB)
    (line,) = lines_for(cfg, "model")
    assert "2 GiB KV cache x 3 TP ranks" in line
    monkeypatch.setattr(capacity, "machine_memory_bytes", lambda: 64 * capacity.GIB)
    assert lines_for(cfg, "model") == []


def test_llama3_8b_weights_are_8b_parameters():
    assert 8.0e9 < capacity.weight_bytes(llama3_8b()) / 2 < 8.1e9


def dir_problem(tmp_path: Path, value: str) -> ConfigProblem | None:
    cfg = cpu_run(dir=value, cache_dir=str(tmp_path / "cache"))
    found = [p for p in validate(cfg) if p.field == "dir"]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_dir_may_not_be_empty_a_file_or_under_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert str(dir_problem(tmp_path, "")) == (
        "dir='': is empty. Fix: dir=results/NAME (or leave the default)"
    )
    assert str(dir_problem(tmp_path, str(afile))).startswith(
        f"dir={afile}: is a file, not a directory. Fix: "
    )
    assert f"cannot be created: {afile} is a file" in str(dir_problem(tmp_path, f"{afile}/run"))


def test_a_dir_too_long_for_the_filesystem_is_refused_without_a_traceback(tmp_path):
    line = str(dir_problem(tmp_path, "a" * 5000))
    assert line.startswith("dir=aaaa") and "...(5000 characters): has a name of 5000 bytes" in line
    deep = "/".join(["a"] * 2000)
    line = str(dir_problem(tmp_path, str(tmp_path / deep)))
    assert "its paths would pass the 4096-byte limit" in line
    assert dir_problem(tmp_path, str(tmp_path / "/".join(["a"] * 100))) is None


@pytest.mark.skipif(not Path("/proc/1").is_dir(), reason="needs Linux /proc")
def test_dir_in_an_unwritable_place_is_refused(tmp_path):
    line = str(dir_problem(tmp_path, "/proc/1/results/run"))
    assert line.startswith("dir=/proc/1/results/run: is on /proc/1, a virtual filesystem")


def test_checking_a_dir_creates_nothing(tmp_path):
    cfg = cpu_run(dir=str(tmp_path / "a" / "b"), cache_dir=str(tmp_path / "c"))
    assert validate(cfg) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("delay_s", [-1, 120, 600])
def test_the_requeue_warning_must_come_inside_the_time_limit(delay_s):
    cfg = cpu_run()
    cfg.cluster.time_limit_min, cfg.cluster.signal_delay_s = 2, delay_s
    (line,) = lines_for(cfg, "cluster.signal_delay_s")
    assert line == (
        f"cluster.signal_delay_s={delay_s}: USR2 must come inside the 2 min time limit, or the "
        "job checkpoints and requeues as soon as it starts (or never). "
        "Fix: 0 (120 s, at most half the limit) or 1 to 119 seconds"
    )
    cfg.cluster.signal_delay_s = 45
    assert lines_for(cfg, "cluster.signal_delay_s") == []


@pytest.mark.parametrize(
    ("override", "start"),
    [
        ("bench.iterations=0", "bench.iterations=0: is not >= 1. Fix: "),
        ('bench.tp_splits=["2->1"]', "bench.tp_splits=2->1: unsupported TP pairing P TP=2"),
        ('bench.tp_splits=["1>2"]', "bench.tp_splits=1>2: TP split '1>2' is not of the form"),
        ("model.dtype=auto", "model.dtype=auto: unknown KV dtype 'auto'"),
    ],
)
def test_transfer_bench_settings_are_refused_before_the_job_starts(override, start):
    cfg = compose_job(["+experiment=transfer_bench", override])
    (line,) = [str(p) for p in validate(cfg)]
    assert line.startswith(start) and ". Fix: " in line, line
    cfg.command = Command.run  # the run command does not read bench.*
    assert [p for p in validate(cfg) if p.field.startswith("bench.")] == []
