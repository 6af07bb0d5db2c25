"""python -m pdbench serve, without servers: what it would launch, what it refuses, what
status says of a serving deployment, and which flows the router lets a client switch to."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs.serving.router import Router, RouterConfig
from pdbench.config.problems import ConfigError
from pdbench.config.schema import Flow, FlowConfig
from pdbench.driver.serve import serve, serving_lines, serving_spec
from pdbench.plan.deployments import make_plan
from pdbench.results.manifest import LaunchOrigin
from pdbench.spec.launch import DeploymentSpec, build_launch, describe, router_settings
from tests.unit.helpers import cpu_run

pytestmark = pytest.mark.unit


def test_serve_launches_the_runs_deployment_with_its_first_flow_and_says_so(capsys):
    cfg = cpu_run(dir="/RUN")
    cfg.launch.dry_run = True
    cfg.flow.flows = [Flow.pull, Flow.recompute]
    serve(cfg, LaunchOrigin.of([]))
    out = capsys.readouterr().out
    assert "serve: after the warm-up, flow pull for any client until stopped" in out
    plan = make_plan(cfg)
    spec = serving_spec(build_launch(cfg, plan, "/model"), "pull")
    (dep,) = spec.deployments
    assert dep.serve_flow == "pull"
    assert DeploymentSpec.from_dict(dep.to_dict()).serve_flow == "pull"  # what the job gets
    # a run's launch is the same but for that line
    plain = describe(build_launch(cfg, plan, "/model"), plan)
    assert "serve:" not in plain


def test_serve_refuses_a_config_of_several_deployments():
    cfg = cpu_run(dir="/RUN")
    cfg.launch.dry_run = True
    cfg.flow.kv_recompute_threshold = [32, 64]
    with pytest.raises(ConfigError, match="command=serve: serves one deployment; this config"):
        serve(cfg, LaunchOrigin.of([]))


class Stats(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        body = json.dumps({"flow": "recompute"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        return


def test_status_says_where_a_deployment_serves_and_whether_it_still_does(tmp_path):
    live = ThreadingHTTPServer(("127.0.0.1", 0), Stats)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{live.server_address[1]}"
        (tmp_path / "serve").mkdir()
        record = {"deployment": "d1", "url": url, "model": "tiny_llama", "started_at": time.time()}
        record["request_log"] = "/RUN/logs/d1/router_requests.jsonl"
        (tmp_path / "serve" / "d1.json").write_text(json.dumps(record))
        stopped = dict(record, deployment="d2", stopped_at=time.time(), stopped_because="signal 2")
        (tmp_path / "serve" / "d2.json").write_text(json.dumps(stopped))
        gone = dict(record, deployment="d3", url="http://127.0.0.1:9")
        (tmp_path / "serve" / "d3.json").write_text(json.dumps(gone))
        text = "\n".join(serving_lines(tmp_path))
    finally:
        live.shutdown()
    assert f"serve d1: {url} model tiny_llama since " in text
    assert "serving now, flow recompute" in text
    assert "requests: /RUN/logs/d1/router_requests.jsonl" in text
    assert "stopped (signal 2)" in text
    assert "serve d3: http://127.0.0.1:9 model tiny_llama" in text and "not answering" in text


def router(**kw) -> Router:
    settings = {"host": "127.0.0.1", **router_settings(FlowConfig(), 30.0, 8000)}
    urls = {"prefill_urls": ["p0"], "decode_urls": ["d0"], "agg_urls": [], "kv_params_urls": ["k"]}
    return Router(RouterConfig(**{**urls, **settings, **kw}))


def test_the_router_refuses_a_flow_its_deployment_cannot_serve():
    assert router().flow_problem("pull") == ""
    assert "use one of" in router().flow_problem("fast")
    assert "does not keep its KV" in router(bidirectional=False).flow_problem("pull")
    assert "does not keep its KV" in router(bidirectional=False).flow_problem("decode_first")
    assert router(bidirectional=False).flow_problem("recompute") == ""
    assert "no prefill" in router(prefill_urls=[]).flow_problem("recompute")
    assert router(prefill_urls=[]).flow_problem("agg") == ""


def test_serve_serves_the_flow_its_group_names_or_refuses():
    """`serve +experiment=smoke flow=decode_first` served agg (the first of the group's flows)
    before; a one-flow group names what it serves, and a flow the deployment was not set up
    for is refused."""
    import pytest as _pytest

    from pdbench.cli import compose_job
    from pdbench.config.problems import ConfigError
    from pdbench.driver.serve import served_flow

    assert served_flow(compose_job(["+experiment=smoke", "flow=decode_first"])) == "decode_first"
    assert served_flow(compose_job(["+experiment=smoke", "flow=pull"])) == "pull"
    assert served_flow(compose_job(["+experiment=smoke"])) == "agg"  # flow=all: the first
    with _pytest.raises(ConfigError, match="flow.serve=decode_first: is not among flow.flows"):
        served_flow(compose_job(["+experiment=smoke", "flow=pull", "flow.serve=decode_first"]))
