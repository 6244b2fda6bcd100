"""A model's Jinja chat template as fixed text around each message, so another template language (Ollama's Go
templates) can say the same thing.

Most chat templates are a per-message concatenation: a role's prefix, the message's content, the role's suffix,
plus text at the start (a BOS token, a default system prompt when the conversation has none) and a generation
prompt at the end. We find those pieces by rendering the template itself (tokenizer.apply_chat_template) with
sentinel contents and reading what lies between them, then check that composing the pieces reproduces the
template on several conversations. A template that does anything else (reorders messages, merges the system
prompt into the first user turn, depends on the content) fails that check and is refused, naming the
conversation where the two differ.

Not reproduced: a template that trims whitespace off the content (Llama 3's `| trim`) composes the same text for
contents without leading or trailing whitespace, which is what the check uses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import ExportError

SENTINEL = "\u2063DRAGON{}\u2063"  # invisible separator around a marker no template writes on its own


@dataclass(frozen=True)
class Segments:
    start_with_system: str  # before the system content, when the conversation opens with a system message
    start_without_system: str  # at the start when it does not (a BOS, a default system prompt)
    system_suffix: str
    user_prefix: str
    user_suffix: str
    assistant_prefix: str
    assistant_suffix: str
    generation_prompt: str  # after the last message, when a reply is asked for

    def as_dict(self) -> dict:
        return asdict(self)


def render(segments: Segments, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The conversation as the segments compose it: what the Ollama template writes, in Python."""
    out = []
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if i == 0:
            out.append(segments.start_with_system if role == "system" else segments.start_without_system)
        if role == "system":
            if i != 0:
                raise ExportError("a system message is only composed as the first message")
            out += [content, segments.system_suffix]
        elif role == "user":
            out += [segments.user_prefix, content, segments.user_suffix]
        elif role == "assistant":
            out += [segments.assistant_prefix, content, segments.assistant_suffix]
        else:
            raise ExportError(f"no segments for role {role!r}")
    if add_generation_prompt:
        out.append(segments.generation_prompt)
    return "".join(out)


def _apply(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # a template raising on a conversation shape (e.g. "system role not supported")
        raise ExportError(
            f"the chat template cannot render {[m['role'] for m in messages]}: {type(exc).__name__}: {exc}"
        ) from exc


def _around(text: str, marker: str, what: str) -> tuple[str, str]:
    if text.count(marker) != 1:
        raise ExportError(
            f"the chat template does not write the {what} content exactly once; it is not a per-message concatenation"
        )
    before, after = text.split(marker)
    return before, after


def _rest(longer: str, shorter: str, what: str) -> str:
    if not longer.startswith(shorter):
        raise ExportError(
            f"the chat template rewrites earlier messages when {what} is added; it is not a per-message concatenation"
        )
    return longer[len(shorter) :]


def derive(tokenizer) -> Segments:
    """The per-role segments of the tokenizer's chat template; ExportError when it has none or is not a
    per-message concatenation."""
    if not getattr(tokenizer, "chat_template", None):
        raise ExportError("the tokenizer has no chat template to derive an Ollama TEMPLATE from")
    s, u, a = (SENTINEL.format(k) for k in ("SYSTEM", "USER", "ASSISTANT"))
    system = [{"role": "system", "content": s}]
    turn = [{"role": "user", "content": u}]
    reply = [{"role": "assistant", "content": a}]

    start_with_system, system_suffix = _around(_apply(tokenizer, system), s, "system")
    only_system = _apply(tokenizer, system)
    with_user = _apply(tokenizer, system + turn)
    user_prefix, user_suffix = _around(_rest(with_user, only_system, "a user message"), u, "user")
    with_reply = _apply(tokenizer, system + turn + reply)
    assistant_prefix, assistant_suffix = _around(_rest(with_reply, with_user, "an assistant reply"), a, "assistant")
    generation_prompt = _rest(
        _apply(tokenizer, system + turn, add_generation_prompt=True), with_user, "the generation prompt"
    )
    before_user, after_user = _around(_apply(tokenizer, turn), u, "user")
    if not before_user.endswith(user_prefix) or after_user != user_suffix:
        raise ExportError("the chat template writes a user message differently when there is no system message")
    segments = Segments(
        start_with_system,
        before_user[: len(before_user) - len(user_prefix)],
        system_suffix,
        user_prefix,
        user_suffix,
        assistant_prefix,
        assistant_suffix,
        generation_prompt,
    )
    check(tokenizer, segments)
    return segments


CHECK_CONVERSATIONS = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Thanks!\nBye."},
    ],
    [
        {"role": "user", "content": "My lamp will not pair."},
        {"role": "assistant", "content": "Reset it."},
        {"role": "user", "content": "Done"},
    ],
    [{"role": "user", "content": "One question"}],
]


def check(tokenizer, segments: Segments) -> None:
    """The segments compose what the template renders, with and without a generation prompt."""
    for messages in CHECK_CONVERSATIONS:
        for prompt in (True, False):
            if render(segments, messages, prompt) != _apply(tokenizer, messages, prompt):
                raise ExportError(
                    f"the chat template is not a per-message concatenation: composing its segments "
                    f"differs from the template for roles {[m['role'] for m in messages]} "
                    f"(add_generation_prompt={prompt})"
                )


def stop_tokens(tokenizer, segments: Segments) -> list[str]:
    """End-of-turn tokens: the special tokens in the assistant's suffix, and the EOS token."""
    added = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    special = sorted(
        {t for t in [*tokenizer.all_special_tokens, *added] if t and t in segments.assistant_suffix},
        key=segments.assistant_suffix.index,
    )
    eos = tokenizer.eos_token
    return special + ([eos] if eos and eos not in special else [])
