"""Serve mode (``python -m pdbench serve``): the run loop's Point source that measures nothing.

It warms every (flow, history length) case of the plan up like a run (NIXL handshakes
between each P and D, first prompt lengths), sets the router's flow, writes
``serve/<deployment>.json`` (the router's URL, the model, the flow, where the router's
per-request record goes) and says so on the job's log, then hands out no Point: the
servers stay up for any client until the job gets SIGTERM (from the driver after its
Ctrl-C, ``scancel``, the time limit: ``TaskState.on_sigterm``) or a server dies. The flow
changes on request (``POST <url>/pdbench/flow {"flow": "recompute"}``); every request the
router serves is one line of ``logs/<deployment>/router_requests.jsonl``
(``jobs.serving.request_log``).
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from pathlib import Path

from connector.process_env import API_KEY_ENV, bearer
from jobs.run.servers import say
from jobs.run.state import TaskState
from jobs.serving import client_commands
from jobs.serving.router_metrics import metrics_urls
from pdbench.plan.deployments import Deployment
from pdbench.plan.points import Point
from pdbench.results.store import RunStore, write_json_atomic
from pdbench.spec.launch import DeploymentSpec
from pdbench.spec.serve_command import served_model_name
from records.point import PointResult

POLL_S = 1.0  # how often the serving task looks for a signal or a dead server


def serve_record_path(store: RunStore, deployment_id: str) -> Path:
    """Where a serving deployment says what it serves (``python -m pdbench status`` reads it)."""
    return store.root / "serve" / f"{deployment_id}.json"


def set_flow(router_url: str, flow: str, tag: str = "serve") -> None:
    """Set the router's flow (what a client does with ``POST /pdbench/flow``)."""
    body = json.dumps({"flow": flow, "tag": tag}).encode()
    request = urllib.request.Request(
        f"{router_url}/pdbench/flow",
        body,
        {"Content-Type": "application/json", **bearer(os.environ)},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


class ServeUntilStopped:
    """A ``jobs.run.next_points.NextPoints`` that warms up, then serves until stopped."""

    def __init__(
        self,
        dep: Deployment,
        points: list[Point],
        ran: DeploymentSpec,
        store: RunStore,
        task: TaskState,
    ):
        self.dep, self.points, self.ran, self.store, self.task = dep, points, ran, store, task
        self.recorded: list[str] = []  # a serve job skips nothing: it measures nothing
        self.served = False

    def warm_up_points(self) -> list[Point]:
        return self.points

    def label(self, point: Point) -> str:
        return point.point_id

    def record(self) -> dict:
        ran = self.ran
        return {
            "deployment": ran.deployment_id,
            "url": ran.router.url,
            "model": served_model_name(self.dep),
            "flow": ran.serve_flow,
            "flows": sorted({p.flow.value for p in self.points}),
            "host": socket.gethostname(),
            "job_id": self.task.job_id,
            "request_log": ran.router.config.get("request_log", ""),
            # what a load generator needs beside the URL: where to scrape, the tokenizer
            "metrics": metrics_urls(ran.router.url, ran.instances),
            "tokenizer": ran.model_path,
            # one command per load generator, as the e2e tier runs them
            "clients": client_commands.commands(self.served_to_clients()),
            "started_at": time.time(),
            "stopped_at": None,
            "stopped_because": "",
        }

    def served_to_clients(self) -> client_commands.Served:
        """What a client needs; GuideLLM's conversations written for a word-level
        tokenizer (``jobs.serving.client_commands``)."""
        ran = self.ran
        results = self.store.root / "clients"
        words = client_commands.tokenizer_words(ran.model_path)
        data = ""
        if words:
            data = str(client_commands.write_conversations(words, results / "conversations.jsonl"))
        return client_commands.Served(
            url=ran.router.url,
            model=served_model_name(self.dep),
            tokenizer=ran.model_path,
            results_dir=str(results),
            api_key=bool(os.environ.get(API_KEY_ENV)),
            on_cpu=not any(i.gpus for i in ran.instances),
            conversations_file=data,
        )

    def next_point(self, measured: list[PointResult]) -> Point | None:
        """The first call serves until the job is stopped (a ``JobInterrupted`` from a signal,
        or a dead server: None); there is never a Point."""
        if self.served:
            return None
        self.served = True
        url = self.ran.router.url
        set_flow(url, self.ran.serve_flow)
        path = serve_record_path(self.store, self.ran.deployment_id)
        record = self.record()
        write_json_atomic(path, record)
        say(
            f"serving {url} model {record['model']} flow {record['flow']}: send OpenAI API "
            f"requests (/v1/chat/completions, /v1/completions; X-Session-ID names a "
            f"conversation); switch flows with POST {url}/pdbench/flow "
            f'{{"flow": "..."}} ({", ".join(record["flows"])} were warmed up); every request '
            f"is recorded in {record['request_log']}; Ctrl-C (or scancel) stops"
        )
        say(
            f"  tokenizer (for a client's --tokenizer): {record['tokenizer']}; Prometheus "
            f"metrics: {', '.join(f'{k} {v}' for k, v in record['metrics'].items())}"
        )
        for client, command in record["clients"].items():
            say(f"  {client}: {command}")
        why = "stopped"
        try:
            while True:
                self.task.check_leaving()
                dead = [p.name for p in self.task.dead()]
                if dead:
                    why = f"server(s) died: {dead}"
                    say(f"{why}; serving ends")
                    return None
                time.sleep(POLL_S)
        except BaseException as exc:
            why = self.task.leaving or f"{type(exc).__name__}: {exc}"
            raise
        finally:
            record.update(stopped_at=time.time(), stopped_because=why)
            write_json_atomic(path, record)
