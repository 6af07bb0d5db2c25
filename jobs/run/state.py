"""What one task of a running deployment job knows and holds, declared in one place.

``TaskState`` is made when the task starts and lives as long as its run: never pickled
(submitit pickles the job entry's ``restart()``, which holds none of it). ``leave`` is how
a signal or the checkpoint stops the run: the Point in progress is not recorded.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from jobs.serving.server import ServerProcess
from jobs.slurm_env import TaskEnvironment
from pdbench.spec.launch import LOOPBACK, DeploymentSpec


class JobInterrupted(SystemExit):
    """SIGTERM reached the task (preemption, ``scontrol requeue``, ``scancel``): tear down and
    leave. A ``SystemExit`` so that no ``except Exception`` records it as a failed Point and
    submitit writes no error result: the driver keeps following a job SLURM requeues."""


@dataclass
class TaskState:
    """One task of the job: who it is, what it started, and whether it is leaving."""

    rank: int  # the task's global rank: its node of the plan
    job_id: str
    attempt: int  # SLURM_RESTART_COUNT: a requeued job keeps its id
    host: str  # the address this task's servers bind and are reached at
    devices: str | None  # CUDA_VISIBLE_DEVICES: the GPUs SLURM gave this task
    procs: list[ServerProcess] = field(default_factory=list)  # servers, then the router
    ran: DeploymentSpec | None = None  # task 0: the spec with every node's address, as it ran
    leaving: str = ""  # why the task leaves (a signal, the checkpoint); "" while it runs

    @classmethod
    def of_environment(cls, spec: DeploymentSpec) -> TaskState:
        env = TaskEnvironment.from_environ()
        return cls(
            rank=env.global_rank,
            job_id=env.job_id or str(os.getpid()),
            attempt=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            host=node_address(spec, env),
            devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )

    def dead(self) -> list[ServerProcess]:
        """The processes this task started that are no longer running."""
        return [p for p in self.procs if not p.alive()]

    def leave(self, why: str) -> None:
        """From now on the run stops at the next ``check_leaving`` (the teardown runs)."""
        self.leaving = why

    def on_sigterm(self, signum, frame) -> None:
        """SIGTERM (preemption, ``scontrol requeue``, ``scancel``): leave. Raised here, where
        it interrupts a wait; an event loop callback may swallow it (uvloop logs it as a
        transport error), so ``check_leaving`` raises it again before anything is recorded."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the teardown runs to its end
        self.leave(f"signal {signum}")
        raise JobInterrupted(f"[pdbench] {self.leaving}: stopping the servers, leaving")

    def check_leaving(self) -> None:
        """Leave (``JobInterrupted``) once a signal or the checkpoint said so: the Point in
        progress, cut short, is not recorded."""
        if self.leaving:
            raise JobInterrupted(
                f"[pdbench] {self.leaving}: the Point in progress is not recorded; stopping "
                "the servers, leaving"
            )


def node_address(spec: DeploymentSpec, env: TaskEnvironment) -> str:
    """The address this task's servers bind and are reached at: loopback when every task
    runs on this machine, the SLURM node's own address otherwise (never localhost across
    nodes). The one place a spec's address placeholders get their value."""
    return LOOPBACK if spec.local else env.address
