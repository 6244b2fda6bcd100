"""The terminal's Dagster log: a line per stage by default (the records at or above the log level besides, each
training step's at INFO); a failed blocking check is one line; any other failure keeps its stack trace."""

import io
import re
import sys

from dagster import AssetCheckResult, Definitions, MaterializeResult, asset, asset_check, define_asset_job

from dragon_dagster.assets.console_log import console_logger
from dragon_dagster.engine.config.reporter import STEP_RECORD_ATTR, StepProgress


@asset
def rows():
    return 1


@asset_check(asset=rows, blocking=True)
def rows_not_leaking():
    return AssetCheckResult(passed=False, description="the held-out rows are in train")


@asset(deps=[rows])
def adapter():
    return 2


@asset
def broken():
    raise RuntimeError("a bug in a stage")


@asset
def tickets() -> MaterializeResult:
    return MaterializeResult(metadata={"rows": 200, "columns": "subject, reply"})


@asset_check(asset=tickets, blocking=True)
def tickets_have_rows():
    return AssetCheckResult(passed=True)


@asset(deps=[tickets])
def trained(context) -> MaterializeResult:
    """Logs its steps as the training resource logs a worker's (resources/launchers/base.py's PipesTap)."""
    for done in (1, 2, 3):
        line = f"step {done}/3 loss {4 - done}.5, grad_norm 1.2 | elapsed {done}s eta {3 - done}s"
        context.log.info(line, extra={STEP_RECORD_ATTR: StepProgress(done, 3, line)})
    context.log.info("an ordinary line of the stage's")
    context.log.warning("a warning the user should see")
    return MaterializeResult(metadata={"train_loss": 1.5, "reward_before": 0.25, "reward_after": 0.5, "global_step": 3})


def run(selection, capfd, log_level: str = "INFO") -> str:
    defs = Definitions(
        assets=[rows, adapter, broken, tickets, trained],
        asset_checks=[rows_not_leaking, tickets_have_rows],
        jobs=[define_asset_job("job", selection=selection)],
        loggers={"console": console_logger},
    )
    config = {"loggers": {"console": {"config": {"log_level": log_level}}}}  # as materialize_pipeline runs it
    defs.resolve_job_def("job").execute_in_process(run_config=config, raise_on_error=False)
    return capfd.readouterr().err


def test_a_failed_blocking_check_is_one_line_without_a_stack_trace(capfd):
    err = run(["rows", "adapter"], capfd)
    failures = [line for line in err.splitlines() if "STEP_FAILURE" in line or "RUN_FAILURE" in line]
    assert len(failures) == 2, err
    assert all("1 blocking asset check failed with ERROR severity: rows: rows_not_leaking" in f for f in failures)
    assert "Stack Trace" not in err and "Traceback" not in err and "DagsterAssetCheckFailedError" not in err


def test_any_other_failure_keeps_its_stack_trace(capfd):
    err = run(["broken"], capfd)
    assert "RuntimeError: a bug in a stage" in err and "Stack Trace:" in err
    assert any(line.startswith("✗ broken  failed after") for line in err.splitlines())


def test_by_default_a_stage_is_a_line_when_it_starts_and_one_when_it_ends(capfd):
    """Not a terminal here (pytest captures stderr): a plain line per stage as it starts instead of a bar. No
    step's line, no Dagster event, nothing at INFO; the warning does show; the check's own step says nothing."""
    lines = run(["tickets", "trained"], capfd, log_level="WARNING").splitlines()
    assert lines[0] == "… tickets" and re.fullmatch(r"✓ tickets  \d+\.\d s  new  200 rows", lines[1]), lines
    assert lines[2] == "… trained"
    assert "a warning the user should see" in lines[3] and "WARNING" in lines[3]
    assert re.fullmatch(r"✓ trained  \d+\.\d s  new  train loss 1\.5, reward 0\.25 -> 0\.5", lines[4]), lines
    assert len(lines) == 5, lines


def test_log_level_info_brings_back_each_step_s_line(capfd):
    err = run(["tickets", "trained"], capfd, log_level="INFO")
    steps = [line for line in err.splitlines() if " - trained - step " in line]
    assert [line.split(" - trained - ")[1].split(" loss")[0] for line in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert "an ordinary line of the stage's" in err
    assert "✓ trained  " in err  # the stage lines stay


class Terminal(io.StringIO):
    """stderr as a terminal: what the console logger draws there, kept."""

    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_stage_is_a_progress_bar_and_then_its_line(capfd, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    run(["tickets", "trained"], capfd, log_level="WARNING")
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())  # without the colours and cursor moves
    assert "3/3 steps" in shown, shown  # the bar, drawn from the steps' records
    lines = [line.split("\r")[-1] for line in shown.splitlines() if line.split("\r")[-1].startswith("✓ ")]
    assert [line.split()[1] for line in lines] == ["tickets", "trained"], shown
    assert "… trained" not in shown  # the bar is its start
