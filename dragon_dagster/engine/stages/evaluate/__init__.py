"""evaluate: the merged model against its base on the same held-out rows (loss, metrics, rewards, judge)."""

from ...config.kind import StageKind
from .checks import report_checks
from .inputs import ReportInputs
from .result import ReportResult
from .settings import Evaluate

KIND = StageKind(
    Evaluate,
    "evaluate",
    ReportInputs,
    ReportResult,
    f"{__name__}.worker:evaluate_report",
    report_checks,
    summary="Base against merged on held-out rows: loss, metrics, rewards, judge.",
)
