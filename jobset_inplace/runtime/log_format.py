"""How the controller's log lines look (``jobset-inplace run --log-format``): ``text`` for
people, ``json`` (one object per line: ``time``, ``level``, ``logger``, ``message``, and
``exception`` with the traceback) for log pipelines."""

from __future__ import annotations

import json
import logging

from jobset_inplace.times import format_time

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": format_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str, level: int = logging.INFO) -> None:
    """The root logger's one handler, on stderr, in ``log_format`` (one of ``FORMATS``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)
