"""A launch's run dir: what it holds of the plan, what a launch skips and runs, its manifest.

``RunDir.open`` refuses a launch that measures something else than the dir holds and reads
each planned Point's state once; a real launch then ``begin``s: it claims the dir (one launch
following jobs in a dir at a time), appends itself to the manifest and says what it skips.
Every job submitted is recorded in the manifest; ``failed`` is what ``launch.on_failure``
reads after each Deployment.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pdbench.config.problems import ConfigError, ConfigProblem
from pdbench.config.schema import OnFailure, RunConfig
from pdbench.driver import provenance
from pdbench.driver.leftovers import run_processes
from pdbench.driver.progress import JobOutcome
from pdbench.driver.slurm_state import live_jobs
from pdbench.plan.deployments import Deployment, Plan
from pdbench.results.jsonable import to_jsonable
from pdbench.results.manifest import LaunchOrigin, mixed_launch_problem, with_launch
from pdbench.results.store import CorruptRecord, RunStore, typed_manifest
from pdbench.validate.environment import check_environment
from records.manifest import Manifest
from records.point import PointStatus
from records.versions import SchemaVersionError

NEWER_FIX = (
    "resume it with the pdbench that recorded it (its manifest's provenance names the git "
    "sha), or give this launch a new dir="
)


def newer_than_this(store: RunStore, what: str, err: SchemaVersionError) -> ConfigError:
    """The refusal of a dir holding ``what`` a newer pdbench wrote (its version named)."""
    message = f"holds {what} this pdbench cannot read: {err}".split(". Fix: ")[0]
    return ConfigError([ConfigProblem("dir", str(store.root), message, NEWER_FIX)])


def point_states(plan: Plan, store: RunStore) -> dict[str, PointStatus]:
    """Every planned Point's status in the dir (each record read once); ``ConfigError`` when a
    record was written by a newer pdbench: it is neither resumed as ok nor measured over."""
    try:
        return {p.point_id: store.point_status(p.point_id) for p in plan.all_points()}
    except SchemaVersionError as err:
        raise newer_than_this(store, "records", err) from err


def pending_deployments(
    plan: Plan, store: RunStore, states: dict[str, PointStatus] | None = None
) -> list[str]:
    """Ids of the Deployments with a Point not yet recorded ``ok`` (what a launch submits)."""
    states = states if states is not None else point_states(plan, store)
    return [
        d.deployment_id
        for d in plan.deployments
        if any(states[p.point_id] is not PointStatus.ok for p in plan.points[d.deployment_id])
        or (d.deployment_id in plan.searches and not search_done(store, d.deployment_id))
    ]


def search_done(store: RunStore, deployment_id: str) -> bool:
    """Whether a Deployment's crossover search ended (its log's last round says done)."""
    path = store.root / "search" / f"{deployment_id}.json"
    try:
        rounds = json.loads(path.read_text()).get("rounds", [])
    except (OSError, ValueError):
        return False
    return bool(rounds) and bool(rounds[-1].get("done"))


def check_same_experiment(
    config: dict[str, Any], manifest: Manifest, store: RunStore, origin: LaunchOrigin
) -> None:
    """Refuse (``ConfigError``) a launch of ``config`` (the composed config as JSON) that
    measures something else than the dir's ``manifest`` holds (pdbench.results.manifest)."""
    problem = mixed_launch_problem(manifest, config, origin, str(store.root))
    if problem is not None:
        raise ConfigError([problem])


def resume_lines(
    plan: Plan, store: RunStore, verbose: bool, states: dict[str, PointStatus] | None = None
) -> list[str]:
    """What a launch into ``store``'s dir skips (Points recorded ``ok``) and runs (pending,
    failed or corrupt records), nothing when the dir holds no record of this plan yet.
    ``verbose``: one line per Point (the dry run); else one line per kind."""
    states = states if states is not None else point_states(plan, store)
    if all(state is PointStatus.pending for state in states.values()):
        return []
    ids = [p.point_id for p in plan.all_points()]
    skip = [pid for pid in ids if states[pid] is PointStatus.ok]
    run = [(pid, states[pid]) for pid in ids if states[pid] is not PointStatus.ok]
    head = f"{store.root} holds records: {len(skip)} Point(s) recorded ok are skipped, "
    head += f"{len(run)} run"
    if verbose:
        return [
            f"{head}:",
            *(f"  skip {pid} (ok)" for pid in skip),
            *(f"  run  {pid} ({state.value})" for pid, state in run),
        ]
    lines = [head]
    if skip:
        lines.append(f"skipping {len(skip)} Point(s) recorded ok: {', '.join(skip)}")
    redo = [f"{pid} ({state.value})" for pid, state in run if state is not PointStatus.pending]
    if redo:
        lines.append(f"measuring again {len(redo)} Point(s) not ok: {', '.join(redo)}")
    return lines


def claim_dir(store: RunStore) -> None:
    """Refuse (``ConfigError``) a launch into a dir another launch is following jobs in."""
    holder = store.claim()
    if holder is not None:
        raise ConfigError(
            [
                ConfigProblem(
                    "dir",
                    str(store.root),
                    f"is in use by another pdbench launch ({holder}): two launches into one "
                    "dir start servers on the same ports and write the same records",
                    "wait for it to end (python -m pdbench status dir=...), or give this "
                    "launch its own dir=",
                )
            ]
        )


def check_no_leftovers(store: RunStore) -> None:
    """Once the dir is this launch's, any process of the run alive here was left behind by
    an earlier one and holds ports this launch would start servers on."""
    found = run_processes(store.root)
    if found:
        raise ConfigError(
            [
                ConfigProblem(
                    "dir",
                    str(store.root),
                    f"{len(found)} process(es) of an earlier launch into this dir are still "
                    f"alive and hold its ports: {'; '.join(p.describe() for p in found)}",
                    f"python -m pdbench stop dir={store.root}, then launch again",
                )
            ]
        )


def typed_previous(previous: dict[str, Any], store: RunStore) -> Manifest:
    """The dir's manifest typed ({}: none yet, or set aside); one a newer pdbench wrote is
    refused (``ConfigError`` naming its version), one that is no manifest is a corrupt one
    (a launch sets it aside, as it does one that does not parse)."""
    try:
        return typed_manifest(previous, store.manifest_path)
    except SchemaVersionError as err:
        raise newer_than_this(store, "a manifest", err) from None
    except CorruptRecord:
        return Manifest()


def check_no_live_jobs(store: RunStore, manifest: Manifest, origin: LaunchOrigin) -> None:
    """Refuse (``ConfigError``) a launch into a dir whose SLURM jobs still run (a detached
    launch's, or one whose driver was lost): they measure its Points and hold its ports.
    Jobs this same command line submitted (an earlier launch of its ``-m`` sweep) are its
    own."""
    earlier = {
        job.job_id: job.deployment_id or "?"
        for job in manifest.jobs
        if job.executor == "slurm" and job.job_id.isdigit() and job.invocation != origin.invocation
    }
    states = live_jobs(list(earlier))  # one squeue call for them all
    live = [f"job {j} ({earlier[j]}) is {state}" for j, state in states.items()]
    if live:
        raise ConfigError(
            [
                ConfigProblem(
                    "dir",
                    str(store.root),
                    f"has SLURM jobs of an earlier launch still alive: {'; '.join(live)}",
                    f"follow them (python -m pdbench status dir={store.root}) or scancel them, "
                    "then launch again",
                )
            ]
        )


def write_manifest(
    configs: list[dict[str, Any]],
    plan: Plan,
    store: RunStore,
    model_path: str,
    origin: LaunchOrigin | None = None,
    traffic: dict[str, Any] | None = None,
) -> None:
    """Append this launch of ``configs`` (the composed configs as JSON: one, or a sweep's
    compositions measured on its servers) to the dir's manifest (its history) and merge its
    Deployments, under the manifest's lock (jobs add their
    nodes' preflight findings to it). ``traffic``: a replayed trace's account (file
    digest, shape as recorded and as replayed: ``pdbench.traffic.replay.Replay.record``)."""
    driver = provenance.collect()

    def update(previous: dict[str, Any]) -> None:
        deployments = merge_deployments(previous.get("deployments", []), plan)
        manifest = previous
        for config in configs:
            manifest = with_launch(
                manifest, config, model_path, driver, origin or LaunchOrigin.of([]), time.time()
            )
        # the nodes' preflight findings (jobs of this run dir so far) stay
        nodes = previous.get("provenance", {}).get("nodes", {})
        manifest["provenance"] = {**manifest["provenance"], "nodes": nodes}
        manifest["deployments"] = deployments
        if traffic is not None:
            manifest["traffic"] = traffic
        previous.clear()
        previous.update(manifest)

    note = store.update_manifest(update)
    if note:
        print(f"[pdbench] {note}", flush=True)


def merge_deployments(previous: list[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """Deployments already in the manifest (earlier jobs of a multirun sharing this run dir)
    stay; this plan's are added or replaced by id."""
    merged = {d["deployment_id"]: d for d in previous}
    for d in plan.deployments:
        points = merged.get(d.deployment_id, {}).get("points", [])
        points += [p.point_id for p in plan.points[d.deployment_id] if p.point_id not in points]
        merged[d.deployment_id] = {
            "deployment_id": d.deployment_id,
            "nodes": d.nodes,
            "instances": [to_jsonable(i) for i in d.instances],
            "points": points,
        }
    return list(merged.values())


def deployment_failed(plan: Plan, store: RunStore, dep: Deployment, outcome: JobOutcome) -> bool:
    """A Deployment failed when its job did, or when any of its Points is not ``ok``."""
    if outcome.failed:
        return True
    return any(
        store.point_status(p.point_id) is not PointStatus.ok for p in plan.points[dep.deployment_id]
    )


def stop_after(
    cfg: RunConfig, plan: Plan, store: RunStore, dep: Deployment, outcome: JobOutcome
) -> bool:
    """Whether ``launch.on_failure=stop`` ends the run after this Deployment."""
    return cfg.launch.on_failure is OnFailure.stop and deployment_failed(plan, store, dep, outcome)


@dataclass
class RunDir:
    """One launch's run dir and what it holds of the plan (each Point's state, read once)."""

    cfg: RunConfig
    config: dict[str, Any]  # cfg as JSON: the manifest's, the tracker's
    plan: Plan
    store: RunStore
    states: dict[str, PointStatus]
    also: list[dict[str, Any]]  # a sweep's other compositions on these servers, as JSON
    origin: LaunchOrigin  # the command line launching (its jobs are recorded with it)

    @classmethod
    def open(
        cls,
        cfg: RunConfig,
        plan: Plan,
        origin: LaunchOrigin,
        claim: bool,
        also: list[RunConfig] | None = None,
    ) -> RunDir:
        """``cfg.dir`` for ``plan`` (measuring ``cfg`` and the sweep compositions ``also``);
        ``ConfigError`` when it holds another experiment or, with ``claim`` (a launch that
        will follow jobs there), when the nodes would run another environment than this
        driver's or another launch holds the dir."""
        store, config = RunStore(cfg.dir), to_jsonable(cfg)
        others = [to_jsonable(c) for c in also or []]
        # a manifest that does not parse is named here on a dry run, which writes nothing; a
        # launch sets it aside in ``write_manifest`` and names it there
        previous, note = store.previous_manifest(set_aside=False)
        if note and cfg.launch.dry_run:
            print(f"[pdbench] {note}", flush=True)
        manifest = typed_previous(previous, store)
        if not cfg.launch.allow_mixed:
            for each in [config, *others]:
                check_same_experiment(each, manifest, store, origin)
        if claim:
            check_environment(cfg)  # the nodes run this driver's interpreter and vLLM
            claim_dir(store)
            # a live job's processes are no leftovers: the job is named, not stopped
            check_no_live_jobs(store, manifest, origin)
            check_no_leftovers(store)
        return cls(cfg, config, plan, store, point_states(plan, store), others, origin)

    @property
    def pending(self) -> list[str]:
        """The Deployments a launch submits: those with a Point not recorded ``ok``."""
        return pending_deployments(self.plan, self.store, self.states)

    def resume_lines(self, verbose: bool) -> list[str]:
        return resume_lines(self.plan, self.store, verbose, self.states)

    def begin(
        self, model_path: str, origin: LaunchOrigin, traffic: dict[str, Any] | None = None
    ) -> None:
        """A real launch: append it to the manifest, say what it skips."""
        write_manifest(
            [self.config, *self.also], self.plan, self.store, model_path, origin, traffic
        )
        for line in self.resume_lines(verbose=False):
            print(f"[pdbench] {line.strip()}", flush=True)

    def record_job(self, deployment_id: str, job: Any) -> None:
        """Keep the submitted job (id, logs) in the manifest: ``status`` reads it."""
        entry = {
            "deployment_id": deployment_id,
            "job_id": str(job.job_id),
            "executor": self.cfg.cluster.executor.value,  # local: the job id is its pid
            "invocation": self.origin.invocation,  # the command line that submitted it
            "submitted_at": time.time(),
            "stdout": str(job.paths.stdout),
            "stderr": str(job.paths.stderr),
        }
        self.store.update_manifest(lambda manifest: manifest.setdefault("jobs", []).append(entry))

    def counts(self) -> tuple[int, int]:
        """Points with a record (ok or failed), and Points planned."""
        ids = [p.point_id for p in self.plan.all_points()]
        return sum(self.store.has_record(i) for i in ids), len(ids)

    def recorded(self) -> str:
        """Progress: Points with a record (ok or failed) of all planned."""
        done, planned = self.counts()
        return f"{done}/{planned} points"

    def stop_after(self, deployment_id: str, outcome: JobOutcome) -> bool:
        """Whether ``launch.on_failure=stop`` ends the run after this Deployment's job."""
        dep = next(d for d in self.plan.deployments if d.deployment_id == deployment_id)
        return stop_after(self.cfg, self.plan, self.store, dep, outcome)

    def all_ok(self) -> bool:
        return all(p.status == PointStatus.ok for p in self.store.iter_points())
