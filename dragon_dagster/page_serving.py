"""How a web page of the project is served (the chat page, the studio, and the chat pages the studio opens): one
typed set of options, built once from the command line (cli/common.page_options) and handed to each page's
`start`. Light on purpose (no Gradio): the CLI builds it before it imports a page."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field

USERNAME = "dragon"  # the login name when a page has a password
CHAT_PORT = 7860  # the chat page's port unless told
STUDIO_PORT = 7861  # the studio's (so both can run side by side)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the page on this machine ("0.0.0.0" or a name other than localhost: no)."""
    if host.strip("[]").lower() in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposed(host: str, password: str | None, share: bool = False) -> bool:
    """Whether a page is reachable beyond this machine (another interface, or a share link) without a password:
    the pages then warn, since what is written on them is trained on."""
    return not password and (share or not is_loopback(host))


class PageServing(BaseModel):
    """Where a page listens and who may use it. With a password, every page and API call needs Gradio's login as
    `username`. share: a public Gradio link; inbrowser: open it in a browser; block: serve until interrupted (False:
    in the background); quiet: no Gradio banner."""

    # hide_input_in_errors: a refused value may be the password
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)
    password: str | None = Field(default=None, repr=False)  # never shown in a log
    username: str = Field(default=USERNAME, min_length=1)
    share: bool = False
    inbrowser: bool = False
    block: bool = True
    quiet: bool = False

    @property
    def exposed(self) -> bool:
        """Reachable beyond this machine without a password (`exposed`)."""
        return exposed(self.host, self.password, self.share)
