"""`dragon studio`: a page from a data file to a trained model (page.py, its handlers in handlers.py), launching
and following the runs it starts through Dagster (launch.py)."""

from .handlers import Studio
from .launch import LocalRun, WebserverRun, webserver_answers
from .page import build_studio, exposure_warning, start

__all__ = ["LocalRun", "Studio", "WebserverRun", "build_studio", "exposure_warning", "start", "webserver_answers"]
