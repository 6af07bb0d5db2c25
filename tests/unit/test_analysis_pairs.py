"""Clusters and strata (analysis/method/pairs.py): the ids are pandas' sorted group numbers,
whatever order the rows come in; a missing key value is named, not grouped silently."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.method.pairs import CLUSTER, STRATUM, cluster_index

pytestmark = pytest.mark.unit


def frame(seed: int, rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "deployment_id": rng.choice(["tiny-b", "tiny-a", "70b-x"], rows),
            "kind": rng.choice(["", "multi_turn", "agentic"], rows),
            "h": rng.choice([0, 1536, 64, 512], rows),
            "repetition": rng.integers(0, 4, rows),
            "turn": rng.integers(1, 4, rows),
        }
    )


def pandas_ids(f: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """What the groupby gives (the ids cluster_index promises)."""
    cl = f.groupby(CLUSTER, sort=True).ngroup().to_numpy()
    firsts = f.assign(_c=cl).drop_duplicates("_c").sort_values("_c")
    return cl, firsts.groupby(STRATUM, sort=True).ngroup().to_numpy()


@pytest.mark.parametrize("seed, rows", [(0, 1), (1, 7), (2, 60), (3, 400)])
def test_cluster_and_stratum_ids_are_the_sorted_group_numbers(seed, rows):
    f = frame(seed, rows)
    cl, st = cluster_index(f, CLUSTER, STRATUM)
    want_cl, want_st = pandas_ids(f)
    assert cl.tolist() == want_cl.tolist()
    assert st.tolist() == want_st.tolist()
    assert len(st) == cl.max() + 1  # one stratum per cluster


def test_an_empty_frame_has_no_clusters():
    cl, st = cluster_index(frame(0, 0), CLUSTER, STRATUM)
    assert len(cl) == 0 and len(st) == 0


def test_a_missing_key_value_is_named():
    f = frame(4, 10).astype({"kind": object})
    f.loc[3, "kind"] = None
    with pytest.raises(ValueError, match="kind: a missing value"):
        cluster_index(f, CLUSTER, STRATUM)
