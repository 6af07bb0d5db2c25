"""The HTTP headers the router and the load generator agree on."""

CONVERSATION_HEADER = "X-Pdbench-Conversation"  # conversation id: the router's affinity key
TURN_HEADER = "X-Pdbench-Turn"
# The client's own request id: recorded with the turn and echoed in the answer.
CLIENT_REQUEST_ID_HEADER = "X-Request-ID"
PATH_HEADER = "X-Pdbench-Path"  # the route the router took for the turn (response)
# How long P took for this turn, as the router saw it (ms; absent when P was not asked): the
# share of TTFT spent before D got the request (response).
PREFILL_MS_HEADER = "X-Pdbench-Prefill-Ms"
# The router's id of this turn (response): P's vLLM request is ``<id>-p``, D's ``<id>-d``
# (agg: ``<id>``); the servers' per-request timing lines carry it.
REQUEST_ID_HEADER = "X-Pdbench-Request-Id"
# The router's own clock over the turn (response), ``name=ms`` pairs joined by ``;``:
# ``route`` (request received -> first upstream request sent), ``p`` (P's answer),
# ``gap`` (P answered -> D's request sent), ``d`` (D's request sent -> its first chunk).
ROUTER_SPANS_HEADER = "X-Pdbench-Router-Spans"


def format_spans(spans: dict[str, float]) -> str:
    return ";".join(f"{k}={v:.3f}" for k, v in spans.items())


def parse_spans(text: str) -> dict[str, float]:
    """``format_spans``' text back to numbers; malformed pairs are skipped."""
    out: dict[str, float] = {}
    for pair in text.split(";"):
        name, _, value = pair.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            continue
    return out
