"""The HTTP headers the router and the load generator agree on."""

CONVERSATION_HEADER = "X-Pdbench-Conversation"  # conversation id: the router's affinity key
TURN_HEADER = "X-Pdbench-Turn"
PATH_HEADER = "X-Pdbench-Path"  # the route the router took for the turn (response)
# How long P took for this turn, as the router saw it (ms; absent when P was not asked): the
# share of TTFT spent before D got the request (response).
PREFILL_MS_HEADER = "X-Pdbench-Prefill-Ms"
