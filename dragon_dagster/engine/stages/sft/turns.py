"""Which assistant turns SFT learns (the train_on setting), and the chat template the rows are rendered with.

- final_turn: rows stay TRL's prompt-completion pairs and the loss is on the completion (completion_only_loss),
  which works with any chat template, SmolLM2's own included.
- all_assistant_turns: rows become {"messages": prompt + completion} and TRL's assistant_only_loss keeps the loss
  on what the template marks with `{% generation %}`: every assistant turn, tool calls included, and nothing of
  the system, user or tool turns. SmolLM2's template has no such marks; tools/template.py's ChatML template,
  which renders plain conversations the same, has them. Other models use their own template when it has the
  marks, or TRL's training version of it; failing both, TemplateError before any training.

Rows with tools or tool turns need a template that renders them (tools/template.py), whichever turns are learned.
"""

from __future__ import annotations

from typing import Literal

from ...tools.template import Rendering, TemplateError, prepare, uses_tools

TrainOn = Literal["final_turn", "all_assistant_turns"]


def prepare_template(tokenizer, rows: list[dict], train_on: TrainOn) -> Rendering:
    """Make tokenizer render rows as train_on needs (in place: training, evaluation and the tokenizer saved with
    the adapter then share it); which rendering it is. Plain rows learned on their final turn keep the model's
    own template ("none")."""
    needed = uses_tools(rows)
    if train_on == "final_turn" and not needed:
        return "none"
    rendering = prepare(tokenizer, needed=needed)
    if train_on == "all_assistant_turns":
        check_marks(tokenizer)
    return rendering


def check_marks(tokenizer) -> None:
    """TemplateError unless the template marks assistant turns, or TRL has a marked version of it to swap in
    (its SFTTrainer does so; Qwen, Llama 3, Gemma, Phi and more)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    name = getattr(tokenizer, "name_or_path", "this model")
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(
            f"{name!r} has no chat template, so no assistant turns to train on: use train_on final_turn"
        )
    if has_generation_markers(tokenizer.chat_template):
        return
    try:
        get_training_chat_template(tokenizer)
    except ValueError as exc:
        raise TemplateError(
            f"train_on all_assistant_turns needs a chat template that marks assistant turns ({{% generation %}}); "
            f"the template of {name!r} has no marks and is not ChatML nor one TRL knows how to mark ({exc}). "
            "Use train_on final_turn, or a model whose template has the marks"
        ) from None


def loss_args(train_on: TrainOn) -> dict[str, bool]:
    """SFTConfig's loss masking for train_on (TRL refuses completion_only_loss on the messages rows that
    assistant_only_loss takes)."""
    return {"completion_only_loss": train_on == "final_turn", "assistant_only_loss": train_on == "all_assistant_turns"}


def training_dataset(rows: list[dict], train_on: TrainOn):
    """The rows as the datasets.Dataset SFTTrainer takes: prompt and completion, or messages for every turn;
    tools when a row has some.

    The turns are stored as JSON (datasets' Json feature): Arrow would otherwise merge every message of the
    column into one struct type, so a call's arguments would gain the keys of every other call as nulls, and
    the template would render those."""
    from datasets import Dataset, Features, Json, List

    if train_on == "all_assistant_turns":
        columns = {"messages": [row["prompt"] + row["completion"] for row in rows]}
    else:
        columns = {"prompt": [row["prompt"] for row in rows], "completion": [row["completion"] for row in rows]}
    features = {name: List(Json()) for name in columns}
    if any(row.get("tools") for row in rows):
        columns["tools"] = [row.get("tools") for row in rows]
        features["tools"] = Json()
    return Dataset.from_dict(columns, features=Features(features))
