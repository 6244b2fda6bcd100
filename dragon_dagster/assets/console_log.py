"""The Dagster log a terminal shows (`dragon demo`, a materialization from Python): Dagster's colored console
logger, with a failed blocking check's step failure said in one line instead of Dagster's stack trace. A failed
check is the pipeline working as meant (bad data stopped before training), not a bug to debug: its reason is the
check's own description, which `dragon demo` prints with the checks after the run. Any other failure keeps its
stack trace."""

from __future__ import annotations

import logging

from dagster import colored_console_logger, logger

TRACE = "\n\nStack Trace:"
CHECK_FAILED = "DagsterAssetCheckFailedError: "  # after its module's name: dagster._core.errors.


class BlockingCheckInOneLine(logging.Filter):
    """A record of a step or run that failed because a blocking check failed, without the stack trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if CHECK_FAILED in text and TRACE in text:
            before, _, why = text.partition(TRACE)[0].partition(CHECK_FAILED)
            what = before.rsplit("\n\n", 1)[0]  # "Execution of step ... failed." without the error's class
            record.msg = f"{' '.join(what.split())} {' '.join(why.split())} (the check's reason is printed below)"
            record.args = ()
        return True


@logger(colored_console_logger.config_schema, description=colored_console_logger.description)
def console_logger(init_context) -> logging.Logger:
    """Dagster's console logger, with BlockingCheckInOneLine."""
    log = colored_console_logger.logger_fn(init_context)
    log.addFilter(BlockingCheckInOneLine())
    return log
