"""The launchers' Pipes tap: it takes the worker's metrics and outcome, passes the rest on to Dagster, and
keeps going past metrics it cannot log."""


def _custom(payload) -> dict:
    return {"__dagster_pipes_version": "0.1", "method": "report_custom_message", "params": {"payload": payload}}


def test_pipes_tap_takes_metrics_and_outcome_and_passes_the_rest_on():
    from dragon_dagster.resources.launchers.base import PipesTap, _TappedHandler

    seen, passed = [], []

    class Handler:
        def handle_message(self, message):
            passed.append(message)

    tap = PipesTap(lambda step, values: seen.append((step, values)))
    handler = _TappedHandler(Handler(), tap)
    log = {"__dagster_pipes_version": "0.1", "method": "log", "params": {"message": "hi", "level": "INFO"}}
    for message in (
        _custom({"kind": "metrics", "step": 1, "values": {"train/loss": 2.5}}),
        log,
        _custom({"note": "not ours"}),
        _custom({"kind": "outcome", "event": "result", "result": {"steps": 3}}),
    ):
        handler.handle_message(message)
    assert seen == [(1, {"train/loss": 2.5})]
    assert tap.outcome == {"event": "result", "result": {"steps": 3}}
    assert passed == [log, _custom({"note": "not ours"})]  # Dagster still gets its own and the user's


def test_pipes_tap_skips_metrics_it_cannot_log_and_keeps_going():
    from dragon_dagster.resources.launchers.base import PipesTap

    seen, warnings = [], []

    def log(step, values):
        if step == 2:
            raise ConnectionError("tracking server unreachable")
        seen.append(step)

    tap = PipesTap(log, warn=warnings.append)
    for message in (
        _custom({"kind": "metrics", "step": 1, "values": {}}),
        _custom({"kind": "metrics", "step": "not a step", "values": {}}),
        _custom({"kind": "metrics", "step": 2, "values": {}}),
        _custom({"kind": "metrics", "step": 3, "values": {}}),
    ):
        assert tap.take(message)
    assert seen == [1, 3] and tap.failures == 2
    assert len(warnings) == 1 and "could not forward" in warnings[0]  # said once, not per line
