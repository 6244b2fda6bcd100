"""What the project's web pages share (the chat page, the studio): an offline theme, the security headers every
response carries, and serving a Gradio app with them as its PageServing says (page_serving.py), behind an optional
login."""

from __future__ import annotations

import os
import sys

# Before gradio is imported: the page must not phone home (offline machines, privacy of a local model).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from .page_serving import PageServing  # noqa: E402

# System fonts only: the default theme fetches Google Fonts, which fails (slowly) on offline machines.
# (Texts avoid emoji too: minimal systems have no emoji font.)
THEME = gr.themes.Soft(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


# The page's own scripts and styles (Gradio inlines its config and styles, so 'unsafe-inline'); images, fonts,
# requests, forms and workers only from the page itself; never inside another site's frame.
CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "media-src 'self' data: blob:",
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class SecurityHeaders:
    """ASGI middleware: SECURITY_HEADERS on every HTTP response of the app (pure ASGI, so streamed replies
    pass through untouched)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.decode("latin-1").lower() not in _HEADER_NAMES
                ]
                message = {**message, "headers": headers + _HEADER_BYTES}
            await send(message)

        await self.app(scope, receive, send_with_headers)


_HEADER_NAMES = {name.lower() for name in SECURITY_HEADERS}
_HEADER_BYTES = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in SECURITY_HEADERS.items()]


def serve(
    app: gr.Blocks,
    css: str,
    warning: str | None,
    serving: PageServing,
    login_name: str | None = None,
    max_file_size: int | None = None,
) -> str:
    """Serve a page (the offline theme, `css`, SECURITY_HEADERS) as `serving` says and return its URL. `warning` (the
    page's exposure warning, or None) goes to stderr first. login_name: the login name as the login page shows it
    (default: serving.username). max_file_size: the largest upload in bytes (Gradio refuses a larger one with the
    limit)."""
    import anyio
    from starlette.middleware import Middleware

    # anyio resolves open_file on first use by importing its module; starlette first asks for it while serving the
    # page's first files, and an import racing another thread's there once failed a page load (a 500 on a script,
    # a page without its inputs). Resolved here, before any request, it is a plain attribute.
    anyio.open_file  # noqa: B018
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    app.queue()  # streaming replies and progress need the queue
    password = serving.password
    app.launch(
        server_name=serving.host,
        server_port=serving.port,
        share=serving.share,
        inbrowser=serving.inbrowser,
        quiet=serving.quiet,
        prevent_thread_lock=not serving.block,
        theme=THEME,
        css=css,
        footer_links=[],
        auth=(serving.username, password) if password else None,
        auth_message=f"Log in as {login_name or serving.username}." if password else None,
        ssr_mode=False,  # the page comes from this app (and its headers), not from a Node front end
        app_kwargs={"middleware": [Middleware(SecurityHeaders)]},
        max_file_size=max_file_size,
    )
    return app.local_url or f"http://{serving.host}:{serving.port}/"
