"""The controller's log lines (runtime/log_format.py): json is one object per line that a log
pipeline parses back, exceptions included; the command line takes the format by name."""

from __future__ import annotations

import io
import json
import logging

import pytest

from jobset_inplace.controller.main import main
from jobset_inplace.runtime.log_format import JsonFormatter, configure
from jobset_inplace.times import parse_time


def test_a_json_line_parses_back_with_its_fields_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("jobset_inplace.test_log_format")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("ns/%s: pass failed: %s", "gang", 'quote " and\nnewline')
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("ns/gang: planning pass failed")
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == 'ns/gang: pass failed: quote " and\nnewline'
    assert (first["level"], first["logger"]) == ("WARNING", "jobset_inplace.test_log_format")
    assert parse_time(first["time"]) is not None
    assert "RuntimeError: boom" in second["exception"]


def test_configure_installs_one_handler_in_the_format() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("json")
        [handler] = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        configure("text")
        [handler] = root.handlers
        assert not isinstance(handler.formatter, JsonFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_an_unknown_log_format_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--log-format", "yaml"])
    assert info.value.code == 2
    assert "--log-format: invalid choice: 'yaml'" in capsys.readouterr().err
