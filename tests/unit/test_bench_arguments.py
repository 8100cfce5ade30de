"""The benchmarks' shared command-line forms (bench/arguments.py) and the benches that use
them: a malformed list is refused naming the form, before anything starts."""

from __future__ import annotations

import argparse
import sys

import pytest

from bench import __main__ as bench_main
from bench import gangstate_fanout, members_write
from bench.arguments import counts


def test_counts_are_comma_separated_integers_at_least_the_minimum() -> None:
    parse = counts(1, "row counts")
    assert parse("1000,5000,10000") == [1000, 5000, 10000]
    assert parse("7,") == [7]  # a trailing comma is no count
    for bad in ("", ",", "10,x", "0", "1.5", "-3"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"comma-separated row counts >= 1"):
            parse(bad)
    assert counts(0, "watch counts")("0,30") == [0, 30]


@pytest.mark.parametrize(
    ("module", "argv", "said"),
    [
        (members_write, ["--rows", "10,abc"], "--rows: expected comma-separated row counts"),
        (members_write, ["--writes", "1"], "--writes: 2 or more"),
        (gangstate_fanout, ["--watchers", "-1"], "--watchers: expected comma-separated watch"),
        (gangstate_fanout, ["--writes", "1"], "--writes: 2 or more"),
    ],
)
def test_the_benches_refuse_malformed_arguments_before_starting(
    module: object,
    argv: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench", *argv])
    with pytest.raises(SystemExit) as ended:
        module.main()  # type: ignore[attr-defined]
    assert ended.value.code == 2
    assert said in capsys.readouterr().err


def test_gang_sizes_are_counts_of_two_or_more_or_none() -> None:
    assert bench_main.parse_args(["--sizes", "500,5000", "--node-death-sizes", "none"]).sizes == [
        500,
        5000,
    ]
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--sizes", "1"])
