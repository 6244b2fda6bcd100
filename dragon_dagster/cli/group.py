"""The `dragon` command group and its error policy: an expected error is one line and exit 1, --debug shows the
traceback."""

from __future__ import annotations

import click

from ..engine.outages import StoreUnavailable
from .common import one_line


class OneLineError(click.ClickException):
    """An expected error, shown as one line on stderr with exit code 1."""

    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


def expected(exc: BaseException) -> bool:
    """Errors that mean bad input or a missing thing, not a bug: ValueError (DataError, PipelineError and
    the other checks are ValueErrors), a missing file or module, click's usage errors, a store that is down or
    refuses the login (StoreUnavailable: its one line names the setting, the host and the fix), and the
    project's own *Error classes (ModelError, TrainingError, BackendError ...)."""
    if isinstance(exc, (click.exceptions.Exit, click.Abort, getattr(click.exceptions, "NoArgsIsHelpError", ()))):
        return False
    if isinstance(exc, (ValueError, FileNotFoundError, ModuleNotFoundError, click.ClickException, StoreUnavailable)):
        return True
    if any(c.__name__ == "MlflowException" for c in type(exc).__mro__):  # a server down, a name unknown to it
        return True
    return any(c.__module__.startswith("dragon_dagster.") and c.__name__.endswith("Error") for c in type(exc).__mro__)


class DragonGroup(click.Group):
    """Every command's expected errors print one line and exit 1; --debug (or DRAGON_DEBUG=1) shows the
    traceback instead."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as exc:  # noqa: BLE001 - re-raised unless expected
            if isinstance(exc, OneLineError) or not expected(exc) or ctx.params.get("debug"):
                raise
            if isinstance(exc, click.ClickException):
                where = getattr(getattr(exc, "ctx", None), "command_path", None)
                message = f"{where}: {exc.format_message()}" if where else exc.format_message()
            else:
                message = str(exc) or type(exc).__name__
            raise OneLineError(one_line(message)) from None


@click.group(name="dragon", cls=DragonGroup)
@click.option(
    "--debug",
    is_flag=True,
    envvar="DRAGON_DEBUG",
    help="Show the traceback of an error instead of one line (also DRAGON_DEBUG=1).",
)
def main(debug: bool):
    """Post-train small language models as Dagster assets tracked in MLflow."""
