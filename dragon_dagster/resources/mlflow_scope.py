"""MLflow's process-wide fluent state (tracking URI, active experiment) set for a block and put back after it:
mlflow.genai and the model registry's models:/ resolution work on that state, not on a client."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_MLFLOW_GLOBALS = threading.Lock()  # mlflow's fluent state is one per process


@contextmanager
def mlflow_scope(uri: str, experiment_id: str) -> Iterator[None]:
    """MLflow's global tracking URI and active experiment set to uri and experiment_id within the block, and
    put back after it, $MLFLOW_TRACKING_URI included (mlflow.set_tracking_uri writes and unsets that variable).
    Traces are flushed before the URI goes back: they are exported in the background, to the current URI.
    MLflow's public API can set both but not say that neither was set, which is what putting them back needs
    (mlflow.get_tracking_uri answers its default for an unset URI; mlflow.set_experiment also writes
    $MLFLOW_EXPERIMENT_ID): the two module globals it keeps them in are read and written here, and nowhere else."""
    import mlflow
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    with _MLFLOW_GLOBALS:
        uri_before, env_before = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
        experiment_before = fluent._active_experiment_id
        try:
            mlflow.set_tracking_uri(uri)
            fluent._active_experiment_id = experiment_id
            yield
        finally:
            try:
                mlflow.flush_trace_async_logging()
            finally:
                fluent._active_experiment_id = experiment_before
                mlflow.set_tracking_uri(uri_before)
                if env_before is None:
                    os.environ.pop("MLFLOW_TRACKING_URI", None)
                else:
                    os.environ["MLFLOW_TRACKING_URI"] = env_before
