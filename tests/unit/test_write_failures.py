"""A write the disk refuses is one line: the file, why, the space left there, the fix; the
driver finds a job's line in submitit's text of its traceback, or says the disk is full
when the job could leave none."""

from __future__ import annotations

import errno

import pytest

from connector.shared_files import write_bytes_atomic
from pdbench.driver.progress import failure_line
from pdbench.results import disk

pytestmark = pytest.mark.unit


def test_a_full_disk_names_the_file_its_space_and_the_fix(tmp_path):
    (tmp_path / "points").mkdir()
    target = tmp_path / "requests" / "pull-h0.jsonl"
    err = OSError(errno.ENOSPC, "No space left on device", str(target))
    line = disk.write_problem(err, str(tmp_path))
    assert line.startswith(f"cannot write {target}: no space left on the device (")
    assert " free of " in line and "rerun with dir= on a larger disk" in line
    assert f"a rerun into {tmp_path} resumes" in line  # it holds records
    assert "resumes" not in disk.write_problem(err, str(tmp_path / "new"))  # none yet
    read_only = disk.write_problem(OSError(errno.EROFS, "Read-only", str(target)))
    assert "read-only" in read_only and "writable dir" in read_only
    assert disk.write_problem(OSError(errno.ENOENT, "No such file", str(target))) is None


def test_an_atomic_write_names_its_target_whatever_failed(tmp_path):
    """A full disk fails the flush, where Python names no file: the write names its path
    (here its parent cannot be made; the e2e tier fills a real disk, test_faults.py)."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(OSError) as caught:
        write_bytes_atomic(blocked / "under_a_file.json", b"{}")  # its parent is a file
    assert caught.value.filename == str(blocked / "under_a_file.json")


def test_the_driver_shows_the_jobs_own_line_and_nothing_else():
    trace = (
        "Job (task=0) failed during processing with trace:\n----------------------\n"
        "Traceback (most recent call last):\n  File ...\n"
        "pdbench.results.disk.RunFailure: cannot write /r/points/x.json: no space left on "
        "the device (/r/points: 0 B free of 400.0 KiB); free space there\n"
    )
    assert failure_line(trace).startswith("cannot write /r/points/x.json: no space left")
    assert failure_line("Traceback ...\nValueError: something else\n") == ""


def test_a_disk_with_room_is_not_full(tmp_path):
    assert disk.full_disk(tmp_path, str(tmp_path)) is None  # the test's own disk has room


def test_a_task_running_another_pdbench_is_said_with_the_fix():
    """An image built from another checkout cannot unpickle the driver's job: the trace's
    AttributeError becomes what it means (issue 37: the image's pdbench unchecked)."""
    trace = "\n".join(
        [
            "Job (task=0) failed during processing with trace:",
            "Traceback (most recent call last):",
            '  File "submitit/core/submission.py", line 55, in process_job',
            "AttributeError: Can't get attribute 'DeploymentJob' on <module 'jobs.entry'>",
        ]
    )
    line = failure_line(trace)
    assert line.startswith("the tasks could not load the job this driver pickled")
    assert "make image" in line and "cluster.python" in line
    assert failure_line("Traceback ...\nModuleNotFoundError: No module named 'records'\n")
    assert failure_line("Traceback ...\nValueError: something else\n") == ""
