"""How a web page is served: one definition (page_serving.PageServing, built by cli/common.page_options) for the
chat page and the studio."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from dragon_dagster.page_serving import CHAT_PORT, STUDIO_PORT, PageServing, exposed
from tests.support import user_project


def served_with(monkeypatch, tmp_path, *flags: str, env: dict | None = None) -> dict[str, PageServing]:
    """What `dragon chat-ui` and `dragon studio` hand their page to serve it, given the same flags."""
    from dragon_dagster import chat_ui, studio
    from dragon_dagster.cli import main

    served: dict[str, PageServing] = {}
    monkeypatch.setattr(chat_ui, "launch", lambda *a, serving, **kw: served.__setitem__("chat-ui", serving))
    monkeypatch.setattr(studio, "build_studio", lambda page: page)
    monkeypatch.setattr(studio, "start", lambda page, serving: served.__setitem__("studio", serving))
    monkeypatch.setenv("DRAGON_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    if not project.exists():
        user_project(project)
    monkeypatch.chdir(project)
    for args in (["chat-ui", "--model", "http://127.0.0.1:9/v1"], ["studio"]):
        out = CliRunner().invoke(main, [*args, *flags], env=env)
        assert out.exit_code == 0, out.output
    return served


def test_the_chat_page_and_the_studio_take_the_same_serving_options(monkeypatch, tmp_path):
    from dragon_dagster.cli import main

    # the same page flags on both commands: one that only one of them had would fail here
    def page_flags(command: str) -> set[str]:
        fields = {*PageServing.model_fields, "password_env"}
        return {opt for p in main.commands[command].params if p.name in fields for opt in p.opts}

    assert page_flags("chat-ui") == page_flags("studio") == {"--host", "--port", "--password-env", "--username"}

    # and given the same flags, each page gets the same PageServing
    flags = ("--host", "0.0.0.0", "--port", "7999", "--password-env", "PAGE_PW", "--username", "ops")
    served = served_with(monkeypatch, tmp_path, *flags, env={"PAGE_PW": "s3cret"})
    expected = PageServing(host="0.0.0.0", port=7999, password="s3cret", username="ops")
    assert served == {"chat-ui": expected, "studio": expected}
    assert "s3cret" not in repr(expected)  # a PageServing in a log shows no password

    # each its own default port (so both can run side by side), the rest the same defaults
    defaults = served_with(monkeypatch, tmp_path)
    assert defaults == {"chat-ui": PageServing(port=CHAT_PORT), "studio": PageServing(port=STUDIO_PORT)}
    assert CHAT_PORT != STUDIO_PORT


def test_page_serving_refuses_what_cannot_be_served():
    with pytest.raises(ValidationError, match="port"):
        PageServing(port=70000)
    with pytest.raises(ValidationError, match="username"):
        PageServing(port=1, username="")
    with pytest.raises(ValidationError, match="hots"):
        PageServing(port=1, hots="0.0.0.0")  # a typo is named, not ignored
    assert not exposed("127.0.0.1", None) and not exposed("0.0.0.0", "pw")
    assert exposed("0.0.0.0", None) and exposed("127.0.0.1", None, share=True)
    assert PageServing(port=1, host="::").exposed and not PageServing(port=1, host="localhost").exposed
