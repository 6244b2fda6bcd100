"""The terminal's Dagster log: a failed blocking check is one line; any other failure keeps its stack trace."""

from dagster import AssetCheckResult, Definitions, asset, asset_check, define_asset_job

from dragon_dagster.assets.console_log import console_logger


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


def run(selection, capfd) -> str:
    defs = Definitions(
        assets=[rows, adapter, broken],
        asset_checks=[rows_not_leaking],
        jobs=[define_asset_job("job", selection=selection)],
        loggers={"console": console_logger},
    )
    config = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}  # as materialize_pipeline runs it
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
