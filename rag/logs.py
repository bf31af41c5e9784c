"""How ragrig's log records reach the terminal and the run's log file (conf/hydra/job_logging):
every line is passed through rag.serving.secrets.redact (a URL's credentials or a pasted key in a message
or a traceback never reach either), and a record the terminal has already been told in ragrig's
own words (`ragrig: error: ...` on stderr) is kept for the log file only, so that an error is one
line on the terminal."""
from __future__ import annotations

import logging

from rag.serving.secrets import redact

# log.error(..., extra=FILE_ONLY): the record goes to run.log, not to the terminal
FILE_ONLY = {"terminal": False}


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class TerminalFilter(logging.Filter):
    """On the console handler: drops the records marked FILE_ONLY."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "terminal", True)
