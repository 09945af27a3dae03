"""The vectorized proof search of the Leap Frog comparison against the definition, without Spark.

``pipelines.leapfrog.first_proofs`` solves every (pair, key) of a Spark partition at once
with sorts and binary searches. Here it is fed random groups (several pairs and keys, mixed
together and cut into arbitrary Arrow batches, as Spark delivers them) and compared with
the definition, written as plainly as possible: w of B proves divergence when some version
v of A overlaps it (``U(v) <= M(w)`` and ``U(w) <= M(v)``, componentwise) with other
content; the witness is the earliest such w and the earliest such v of it.
"""
from __future__ import annotations

import random

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.leapfrog import first_proofs


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


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), regions=st.integers(1, 3), batch_rows=st.integers(1, 40))
def test_the_vectorized_search_finds_exactly_the_first_proof_of_every_group(seed, regions, batch_rows):
    # Catches: groups mixed up (keys or pairs sharing a rank array), an off-by-one between
    # "<=" and "<" in the two rank problems, the witness taken at s when the range's first
    # differing version lies further, a later proof reported instead of the earliest, or
    # rows lost when a partition arrives in several batches.
    rng = random.Random(seed)
    groups = {
        (pair, f"k{key}"): (_side(rng, rng.randint(0, 6), regions), _side(rng, rng.randint(0, 6), regions))
        for pair in (1, 2)
        for key in range(rng.randint(1, 5))
    }
    rows = [
        {"pair_id": pair, "key": key, "is_a": is_a, "idx": v["idx"], "token": v["token"],
         "run_end": v["run_end"] if is_a else None,
         **{f"u_{r}": v["u"][r] for r in range(regions)}, **{f"m_{r}": v["m"][r] for r in range(regions)}}
        for (pair, key), sides in groups.items()
        for is_a, side in ((True, sides[0]), (False, sides[1]))
        for v in side
    ]
    rng.shuffle(rows)
    schema = pa.schema(
        [("pair_id", pa.int64()), ("key", pa.string()), ("is_a", pa.bool_()), ("idx", pa.int64()),
         ("token", pa.string()), ("run_end", pa.int64())]
        + [(f"{c}_{r}", pa.int64()) for c in "um" for r in range(regions)]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    batches = table.to_batches(max_chunksize=batch_rows) if rows else []

    found = {}
    for batch in first_proofs(iter(batches), regions=regions):
        for row in batch.to_pylist():
            assert (row["pair_id"], row["key"]) not in found, "one proof per (pair, key)"
            found[(row["pair_id"], row["key"])] = (row["w_idx"], row["v_idx"])
    assert found == _by_definition(groups)


def test_a_hot_key_is_searched_in_memory_linear_in_its_versions():
    # Catches: a search that compares every version of A with every version of B (a pairwise
    # numpy broadcast of a hot key's 20,000 x 20,000 versions needs 400 MB for one boolean
    # matrix; the search's arrays are a few times the 40,000 rows).
    import tracemalloc

    versions = 20_000
    rows = {
        "pair_id": [1] * (2 * versions), "key": ["hot"] * (2 * versions),
        "is_a": [True] * versions + [False] * versions, "idx": list(range(versions)) * 2,
        # Every version of B overlaps every version of A, and only B's last one differs.
        "token": ["x"] * (2 * versions - 1) + ["y"], "run_end": [versions] * versions + [None] * versions,
        "u_0": [0] * (2 * versions), "m_0": [10] * (2 * versions),
    }
    batch = pa.RecordBatch.from_pydict(rows)
    tracemalloc.start()
    try:
        found = [row for out in first_proofs(iter([batch]), regions=1) for row in out.to_pylist()]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == [{"pair_id": 1, "key": "hot", "w_idx": versions - 1, "v_idx": 0}]
    assert peak < 40 * 1024 * 1024, peak
