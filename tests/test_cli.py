"""The command line's error contract: a usage error in one line (exit 2), a bug reported as a bug (exit 70)."""
from __future__ import annotations

import pytest

import replica_lens.simulator as simulator
from replica_lens.cli import EXIT_INTERNAL, EXIT_USAGE, main


def test_a_setting_out_of_range_is_a_usage_error_in_one_line(tmp_path, capsys):
    # Catches: usage errors left to escape as a traceback, or reported with another exit code.
    assert main(["simulate", "--out", str(tmp_path), "--regions", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("replica-lens: ") and "regions must be at least 1" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_existing_snapshot_and_an_unknown_benchmark_variant_are_usage_errors(tmp_path, capsys):
    # Catches: a usage error class that lost its UsageError base (it would then be reported as a bug).
    assert main(["simulate", "--out", str(tmp_path), "--snapshot-id", "s1", "--writes", "5"]) == 0
    capsys.readouterr()
    assert main(["simulate", "--out", str(tmp_path), "--snapshot-id", "s1", "--writes", "5"]) == EXIT_USAGE
    assert "already exists" in capsys.readouterr().err
    out = tmp_path / "bench.json"
    assert main(["benchmark", "--variants", "nope", "--json", str(out), "--process-runs", "0"]) == EXIT_USAGE
    assert "unknown variant(s) nope" in capsys.readouterr().err


@pytest.mark.parametrize("verbose", [False, True])
def test_a_value_error_from_a_bug_is_reported_as_a_bug_not_as_a_usage_error(tmp_path, capsys, monkeypatch, verbose):
    # Catches: every ValueError taken for the user's mistake (exit 2, "fix your input"), and the
    # traceback printed without --verbose or withheld with it.
    def broken(*_args, **_kwargs):
        raise ValueError("cannot reshape array of size 3\nsecond line of detail")

    monkeypatch.setattr(simulator, "simulate", broken)
    argv = ["simulate", "--out", str(tmp_path)] + (["--verbose"] if verbose else [])
    assert main(argv) == EXIT_INTERNAL
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("replica-lens: internal error (ValueError: cannot reshape array of size 3)")
    assert "this is a bug" in last and "--verbose" in last
    assert ("Traceback" in err) is verbose
    if not verbose:
        assert len(err.strip().splitlines()) == 1
