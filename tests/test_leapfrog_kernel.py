"""The vectorized proof search of the Leap Frog comparison against the definition, without Spark.

``pipelines.leapfrog.earliest_proofs`` solves every (pair, key) of a Spark partition at
once with sorts and binary searches. Here it is fed random groups (several pairs and keys,
their rows shuffled together) and compared with
the definition, written as plainly as possible: w of B proves divergence when some version
v of A overlaps it (``U(v) <= M(w)`` and ``U(w) <= M(v)``, componentwise) with other
content; the witness is the earliest such w and the earliest such v of it.
"""
from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.leapfrog import earliest_proofs
from tests.examples import examples


def _side(rng: random.Random, count: int, regions: int) -> list[dict]:
    """Versions of one key in one replica: U and M only grow along the versions (as reconstructed)."""
    u = [rng.choice([-1, 0]) for _ in range(regions)]
    m = [x + rng.randint(0, 2) for x in u]
    versions = []
    for i in range(count):
        u = [max(x, rng.choice([x, x + 1, x + 3])) for x in u]
        m = [max(mx, ux + rng.randint(0, 3)) for mx, ux in zip(m, u)]
        versions.append({"idx": i, "token": rng.choice("xyz"), "u": list(u), "m": list(m)})
    for i, version in enumerate(versions):  # where the run of equal tokens it is in ends
        end = i
        while end < count and versions[end]["token"] == version["token"]:
            end += 1
        version["run_end"] = end
    return versions


def _leq(x: list[int], y: list[int]) -> bool:
    return all(a <= b for a, b in zip(x, y))


def _by_definition(groups: dict) -> dict:
    found = {}
    for group, (a_side, b_side) in groups.items():
        for w in b_side:
            differing = [
                v for v in a_side
                if _leq(v["u"], w["m"]) and _leq(w["u"], v["m"]) and v["token"] != w["token"]
            ]
            if differing:
                found[group] = (w["idx"], differing[0]["idx"])
                break
    return found


def _search(rows: list[dict], regions: int) -> list[tuple[int, int, int]]:
    """``earliest_proofs`` over ``rows`` (dicts with group, is_a, idx, token, run_end, u, m): (group, w, v)."""
    def column(name, dtype=np.int64):
        return np.array([r[name] for r in rows], dtype=dtype)

    groups, w_idx, v_idx = earliest_proofs(
        column("group"), ~column("is_a", bool), column("idx"), column("token"), column("run_end"),
        [np.array([r["u"][i] for r in rows], dtype=np.int64) for i in range(regions)],
        [np.array([r["m"][i] for r in rows], dtype=np.int64) for i in range(regions)],
    )
    return list(zip(groups.tolist(), w_idx.tolist(), v_idx.tolist()))


@settings(max_examples=examples(150), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), regions=st.integers(1, 3), huge=st.booleans())
def test_the_vectorized_search_finds_exactly_the_first_proof_of_every_group(seed, regions, huge):
    # Catches: groups mixed up (keys or pairs sharing a rank array), an off-by-one between
    # "<=" and "<" in the two rank problems, the witness taken at s when the range's first
    # differing version lies further, a later proof reported instead of the earliest, or
    # a search that depends on the order its rows arrive in. ``huge``: offsets near 2**62, so that
    # the values are ranked (group * span + value would overflow); else they are compared as they are.
    rng = random.Random(seed)
    groups = {
        group: (_side(rng, rng.randint(0, 6), regions), _side(rng, rng.randint(0, 6), regions))
        for group in range(rng.randint(1, 10))
    }
    tokens = {"x": 0, "y": 1, "z": 2}
    rows = [
        {"group": group, "is_a": is_a, "idx": v["idx"], "token": tokens[v["token"]],
         "run_end": v["run_end"] if is_a else -1, "u": v["u"], "m": v["m"]}
        for group, sides in groups.items()
        for is_a, side in ((True, sides[0]), (False, sides[1]))
        for v in side
    ]
    rng.shuffle(rows)
    if huge:  # the same order and equalities, -1 (missing) still below every offset
        for row in rows:
            row["u"], row["m"] = ([x if x < 0 else x + 2**62 for x in row[v]] for v in ("u", "m"))
    found = _search(rows, regions)
    assert len({g for g, _, _ in found}) == len(found), "one proof per group"
    assert {g: (w, v) for g, w, v in found} == _by_definition(groups)


def test_a_hot_key_is_searched_in_memory_linear_in_its_versions():
    # Catches: a search that compares every version of A with every version of B (a pairwise
    # numpy broadcast of a hot key's 20,000 x 20,000 versions needs 400 MB for one boolean
    # matrix; the search's arrays are a few times the 40,000 rows).
    import tracemalloc

    versions = 20_000
    # Every version of B overlaps every version of A, and only B's last one differs.
    rows = {
        "group": np.zeros(2 * versions, np.int64), "is_b": np.repeat([False, True], versions),
        "idx": np.tile(np.arange(versions), 2), "token": np.append(np.zeros(2 * versions - 1, np.int64), 1),
        "run_end": np.full(2 * versions, versions), "u": [np.zeros(2 * versions, np.int64)],
        "m": [np.full(2 * versions, 10, np.int64)],
    }
    tracemalloc.start()
    try:
        groups, w_idx, v_idx = earliest_proofs(**rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (groups.tolist(), w_idx.tolist(), v_idx.tolist()) == ([0], [versions - 1], [0])
    assert peak < 40 * 1024 * 1024, peak
