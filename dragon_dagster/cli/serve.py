"""`dragon serve`: the OpenAI-compatible server for registered models (dragon_dagster/serving/), and
`dragon serve-key`, which makes an API key for it."""

from __future__ import annotations

import click

from .common import console
from .group import main


@main.command()
@click.argument("targets", nargs=-1, required=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="0.0.0.0 to listen on every interface.")
@click.option("--port", default=8000, show_default=True)
@click.option(
    "--keys-file",
    type=click.Path(dir_okay=False),
    help="API keys, NAME:KEY or NAME:sha256:HEX a line (also $DRAGON_SERVE_KEYS). None: the server is open.",
)
@click.option("--requests-per-minute", default=0, show_default=True, help="Per key (per address when open); 0: none.")
@click.option("--tokens-per-minute", default=0, show_default=True, help="Prompt and reply tokens per key; 0: none.")
@click.option("--max-tokens-cap", default=1024, show_default=True, help="The largest max_tokens a request may ask.")
@click.option("--default-max-tokens", default=256, show_default=True, help="A request's max_tokens when it sets none.")
@click.option("--body-limit-kb", default=1024, show_default=True, help="The largest request body.")
@click.option("--request-timeout", default=300.0, show_default=True, help="Seconds a request may take.")
@click.option("--max-batch", default=32, show_default=True, help="Requests decoded together.")
@click.option("--max-queue", default=64, show_default=True, help="Requests waiting for the batch; more get 429.")
@click.option("--cache-tokens", default=32768, show_default=True, help="The KV cache, in tokens, over all requests.")
@click.option(
    "--challenger-share",
    default=0.0,
    show_default=True,
    help="The share of users (sticky by user id) a bare name sends to NAME@challenger.",
)
@click.option(
    "--watch",
    "watch_s",
    default=10.0,
    show_default=True,
    help="Seconds between looks at the registry's aliases (hot swap); 0: never.",
)
@click.option("--device", default="auto", show_default=True, help="auto, cuda, mps or cpu.")
@click.option("--dtype", default="auto", show_default=True, help="auto, bfloat16, float16 or float32.")
@click.option(
    "--upstream",
    default=None,
    help="Decode on this OpenAI-compatible server (base URL, e.g. vLLM's "
    "http://host:8000/v1; its key from $DRAGON_UPSTREAM_KEY) instead of the built-in batcher: one fixed "
    "model, no hot swap.",
)
@click.option("--upstream-model", default=None, help="The upstream's name for the model (default: the served name).")
@click.option(
    "--llama-server",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="llama.cpp's llama-server binary: each version is written once as an f16 GGUF and decoded there.",
)
@click.option("--parallel", default=16, show_default=True, help="With --llama-server: its --parallel slots.")
@click.option("--no-trace", is_flag=True, help="Write no MLflow traces (ratings are then not mirrored there).")
def serve(
    targets,
    host,
    port,
    keys_file,
    requests_per_minute,
    tokens_per_minute,
    max_tokens_cap,
    default_max_tokens,
    body_limit_kb,
    request_timeout,
    max_batch,
    max_queue,
    cache_tokens,
    challenger_share,
    watch_s,
    device,
    dtype,
    upstream,
    upstream_model,
    llama_server,
    parallel,
    no_trace,
):
    """Serve TARGETS over the OpenAI chat protocol, with keys, limits, traces, feedback and hot swap.

    TARGETS: registered model names (`support`: its champion, swapped when a retraining promotes another;
    requests may name `support@challenger` or `support/3`), or directories and asset names (an adapter chain is
    merged once into a cached directory), served under their pipeline's name.
    """
    from ..engine.serve.batching import BatchingOptions
    from ..serving.app import Policy
    from ..serving.launch import Options
    from ..serving.launch import serve as run

    if not 0 <= challenger_share <= 1:
        raise click.BadParameter("must be between 0 and 1", param_hint="--challenger-share")
    if upstream and llama_server:
        raise click.UsageError("give --upstream or --llama-server, not both")
    if default_max_tokens > max_tokens_cap:
        raise click.BadParameter("is over --max-tokens-cap", param_hint="--default-max-tokens")
    run(
        Options(
            targets=list(targets),
            host=host,
            port=port,
            keys_file=keys_file,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            policy=Policy(max_tokens_cap, default_max_tokens, body_limit_kb * 1024, request_timeout),
            batching=BatchingOptions(
                max_batch=max_batch, max_queue=max_queue, cache_tokens=cache_tokens, device=device, dtype=dtype
            ),
            challenger_share=challenger_share,
            watch_s=watch_s,
            trace=not no_trace,
            upstream_url=upstream,
            upstream_model=upstream_model,
            llama_server=llama_server,
            parallel=parallel,
        )
    )


@main.command("serve-key")
@click.argument("name")
def serve_key(name: str):
    """Make an API key for `dragon serve`: the key (give it to the client; it is shown once) and the line for the
    server's keys file, which holds only its hash."""
    from ..serving.access import digest, new_key

    if ":" in name or "," in name or not name.strip():
        raise click.BadParameter("a name without ':' or ','", param_hint="NAME")
    key = new_key()
    console.print(f"key for {name} (shown once): {key}")
    console.print(f"its line for --keys-file or $DRAGON_SERVE_KEYS: {name}:sha256:{digest(key)}")
