"""One local reply streamed as text chunks while `model.generate` runs in a thread of its own.

Decoding as in evaluate.replies.generate (the same weights and loop), so the chunks join to the reply a
non-streamed call gives. A `threading.Event` ends generation at the next token. Framework-free.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .backend import BackendError


def _stop_criteria(*events: threading.Event):
    """A StoppingCriteria that ends generation at the next token once any of `events` is set."""
    import torch
    from transformers import StoppingCriteria

    class StopOnEvent(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            stop = any(event.is_set() for event in events)
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return StopOnEvent()


# How long a streamed local reply waits for its next token before giving up on the generating thread: far
# beyond any token time, it only keeps a wedged generation from hanging the reader forever.
TOKEN_TIMEOUT_S = 600.0


def stream_generate(
    model,
    tokenizer,
    conversation: list[dict],
    stop: threading.Event,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 42,
    lock: threading.Lock | None = None,
    tools: list[dict] | None = None,
) -> Iterator[str]:
    """One reply as decoded text chunks while model.generate runs in a thread (settings and decoding as in
    evaluate.replies.generate, so the chunks join to the same text). Setting `stop` ends generation at the
    next token; leaving this generator early (close, an exception in the reader) stops it too, and the thread
    is always joined before the generator ends. `lock` (the model's) is held by the generating thread only, so
    a reader that is never resumed (an abandoned web request) cannot keep the model locked beyond one reply.
    tools: the schemas the chat template renders (the tokenizer readied for them)."""
    import torch
    from transformers import StoppingCriteriaList, TextIteratorStreamer

    from . import decode_loop, decode_weights

    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, tools=tools or None)
    inputs = tokenizer([text], return_tensors="pt", add_special_tokens=False).to(next(model.parameters()).device)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=TOKEN_TIMEOUT_S, skip_special_tokens=True)
    failure: list[BaseException] = []
    left = threading.Event()  # the reader is gone: stop without touching the caller's event

    def run() -> None:
        try:
            # the weights evaluate.replies.generate decodes with (CPU: folded, packed), so the text is the same
            with lock or contextlib.nullcontext(), torch.no_grad(), decode_weights.prepared(model, 1):
                torch.manual_seed(seed)
                model.generate(
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    custom_generate=decode_loop.decode,  # generate hands its own `streamer` to built-in loops only
                    token_streamer=streamer,
                    **sampling,
                    stopping_criteria=StoppingCriteriaList([_stop_criteria(stop, left)]),
                )
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            failure.append(exc)
            streamer.end()  # the reader waits for the end signal

    thread = threading.Thread(target=run, name="dragon-stream-generate", daemon=True)
    thread.start()
    try:
        for chunk in streamer:
            if chunk:
                yield chunk
    finally:
        left.set()  # a reader that left early must not leave the model generating (or holding its lock)
        thread.join()
    if failure:
        raise BackendError(f"local generation failed: {type(failure[0]).__name__}: {failure[0]}") from failure[0]
