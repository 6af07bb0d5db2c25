"""A run's processes left alive on this machine are found by the run dir in their
environment, listed by ``status`` with their ports, ended by ``python -m pdbench stop``, and
a launch into the dir refuses to start beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from connector.process_env import RUN_DIR_ENV
from pdbench.config.problems import ConfigError
from pdbench.driver.leftovers import run_processes
from pdbench.driver.run_dir import check_no_leftovers
from pdbench.driver.status import leftover_lines, stop_leftovers
from pdbench.results.store import RunStore

pytestmark = pytest.mark.unit

LISTENER = (
    "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "print(s.getsockname()[1], flush=True); time.sleep(120)"
)


@pytest.fixture
def leftover(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"name": "x"}))
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER],
        env={**os.environ, RUN_DIR_ENV: str(run_dir)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    port = int(proc.stdout.readline())
    yield run_dir, proc, port
    proc.kill()
    proc.wait()


def test_a_left_process_is_found_listed_refused_and_stopped(leftover, capsys):
    run_dir, proc, port = leftover
    (found,) = run_processes(run_dir)
    assert found.pid == proc.pid and found.ports == (port,)
    store = RunStore(run_dir)
    head, line = leftover_lines(store)
    assert "left behind" in head and f"python -m pdbench stop dir={store.root}" in head
    assert line.strip().startswith(f"pid {proc.pid} listening on {port}")
    with pytest.raises(ConfigError) as err:
        check_no_leftovers(store)
    assert "1 process(es) of an earlier launch" in str(err.value)
    assert f"python -m pdbench stop dir={store.root}" in str(err.value)
    stop_leftovers(str(run_dir))
    assert proc.wait(timeout=15) is not None
    assert run_processes(run_dir) == [] and leftover_lines(store) == []
    assert "1 process(es) of" in capsys.readouterr().out
    check_no_leftovers(store)  # nothing left: a launch may start


def test_stop_refuses_while_a_launch_follows_the_dir(leftover):
    run_dir, proc, _ = leftover
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from pdbench.results.store import RunStore; "
            f"RunStore({str(run_dir)!r}).claim(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        store = RunStore(run_dir)
        assert store.held_by().startswith(f"pid {holder.pid}")
        assert "processes of the launch that follows" in leftover_lines(store)[0]
        with pytest.raises(SystemExit, match="a launch follows this dir"):
            stop_leftovers(str(run_dir))
        time.sleep(0.2)
        assert proc.poll() is None  # untouched
    finally:
        holder.kill()
        holder.wait()
    assert RunStore(run_dir).held_by() is None
