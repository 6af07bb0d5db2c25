"""What a run writes and reads back, typed once (a leaf package: it imports nothing of the
project, so the jobs and the connector that write records, the driver and the analysis that
read them all import it).

``point`` (a Point's result and its request lines), ``trace`` (one KV transfer of a traced
run), ``bench`` (one transfer-bench case), ``manifest`` (a run dir's experiment and its
launches), ``model`` (a model's shape); ``versions`` (each file's ``schema_version``)
and ``read`` (records decoded back into these types, or refused naming what is wrong).
"""
