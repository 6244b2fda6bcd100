"""SFT's train_on: exactly which tokens a tool-use conversation trains (every assistant turn, or the final one),
the chat template it needs, and a short run on the tiny model with every assistant turn."""

import json

import pandas as pd
import pytest

from dragon_dagster.engine import models
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.data import row_mapping, tables
from dragon_dagster.engine.stages.sft import turns
from dragon_dagster.engine.stages.sft.trainer import resumable_trainer
from dragon_dagster.engine.stages.sft.worker import train_sft
from dragon_dagster.engine.tools.template import TemplateError
from tests.support import sft_job

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
FIRST_ANSWER = "Hello! Ask me about the weather."
# the call as the ChatML tool format writes it (tools/template.py, the Hermes/Qwen2.5 convention)
RENDERED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL_ANSWER = "It is 21 C in Paris."


def tool_conversation(city="Paris", temp=21):
    """system, a first user/assistant exchange, then user -> assistant tool call -> tool result -> answer."""
    return [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": FIRST_ANSWER},
        {"role": "user", "content": f"What is the weather in {city}?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}],
        },
        {"role": "tool", "name": "get_weather", "content": f"{temp} C, sunny"},
        {"role": "assistant", "content": f"It is {temp} C in {city}."},
    ]


def tool_rows(n=1):
    cities = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Turin"]
    conversations = [tool_conversation(cities[i % len(cities)], 21 + i) for i in range(n)]
    return row_mapping.map_rows(
        pd.DataFrame({"messages": conversations, "tools": [json.dumps(TOOLS)] * n}), row_mapping.Mapping()
    )


def trained_spans(tiny_model, tmp_path, rows, train_on):
    """The tokenizer, the rendering, and the first row's trained and untrained text, each a list of the
    contiguous spans of tokens with (or without) loss, built as the SFT worker builds its trainer."""
    from trl import SFTConfig

    tokenizer = models.load_tokenizer(str(tiny_model))
    rendering = turns.prepare_template(tokenizer, rows, train_on)
    trainer = resumable_trainer()(
        model=str(tiny_model),
        processing_class=tokenizer,
        train_dataset=turns.training_dataset(rows, train_on),
        args=SFTConfig(
            output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none", **turns.loss_args(train_on)
        ),
    )
    example = trainer.train_dataset[0]  # TRL turns the masks into labels (-100: no loss)
    spans = {True: [], False: []}
    previous = None
    for token, label in zip(example["input_ids"], example["labels"]):
        trained = label != -100
        if trained != previous:
            spans[trained].append([])
        spans[trained][-1].append(token)
        previous = trained
    decode = lambda groups: [tokenizer.decode(g) for g in groups]  # noqa: E731
    return tokenizer, rendering, decode(spans[True]), decode(spans[False])


def test_every_assistant_turn_and_nothing_else_is_trained_with_all_assistant_turns(tiny_model, tmp_path):
    rows = tool_rows()
    tokenizer, rendering, trained, context = trained_spans(tiny_model, tmp_path, rows, "all_assistant_turns")
    assert rendering == "fallback"  # SmolLM2's own template renders no tools and has no generation marks
    assert trained == [f"{FIRST_ANSWER}<|im_end|>", f"{RENDERED_CALL}<|im_end|>", f"{FINAL_ANSWER}<|im_end|>"]
    untrained = "".join(context)
    for text in ("You help with weather.", "Hi there", "What is the weather in Paris?", "21 C, sunny", "get_weather"):
        assert text in untrained  # system, user and tool turns (and the tools' schemas) are context only
    assert "<tool_response>\n21 C, sunny\n</tool_response>" in untrained


def test_only_the_final_answer_is_trained_with_final_turn(tiny_model, tmp_path):
    rows = tool_rows()
    _, rendering, trained, context = trained_spans(tiny_model, tmp_path, rows, "final_turn")
    assert rendering == "fallback"  # tool turns need the tool format even when only the last turn is learned
    assert trained == [f"{FINAL_ANSWER}<|im_end|>\n"]
    assert f"{FIRST_ANSWER}<|im_end|>" in "".join(context) and RENDERED_CALL in "".join(context)


def test_plain_conversations_render_as_the_models_own_template(tiny_model, tmp_path):
    messages = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": FIRST_ANSWER}]
    rows = row_mapping.map_rows(pd.DataFrame({"messages": [messages]}), row_mapping.Mapping())
    own = models.load_tokenizer(str(tiny_model))
    expected = own.apply_chat_template(messages, tokenize=False)
    tokenizer, rendering, trained, context = trained_spans(tiny_model, tmp_path, rows, "all_assistant_turns")
    assert rendering == "fallback" and trained == [f"{FIRST_ANSWER}<|im_end|>"]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == expected and "".join(context).startswith("<|im_start|>system\n")  # the default system turn
    # learned on the final turn only, plain rows keep the model's template untouched
    untouched = models.load_tokenizer(str(tiny_model))
    assert turns.prepare_template(untouched, rows, "final_turn") == "none"
    assert untouched.chat_template == own.chat_template


def test_a_template_that_cannot_mark_assistant_turns_fails_before_training(tiny_model):
    tokenizer = models.load_tokenizer(str(tiny_model))
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(TemplateError, match="marks assistant turns"):
        turns.check_marks(tokenizer)
    tokenizer.chat_template = None
    rows = row_mapping.map_rows(pd.DataFrame({"q": ["q"], "a": ["a"]}), row_mapping.Mapping(prompt="q", response="a"))
    with pytest.raises(TemplateError, match="no chat template"):
        turns.prepare_template(tokenizer, rows, "all_assistant_turns")


def test_sft_trains_every_assistant_turn_of_tool_conversations(tiny_model, tmp_path):
    rows = tool_rows(10)
    tables.write_jsonl(tmp_path / "train.jsonl", rows[:8])
    tables.write_jsonl(tmp_path / "eval.jsonl", rows[8:])
    job = sft_job(tmp_path, tiny_model, tmp_path / "train.jsonl", tmp_path / "eval.jsonl", max_steps=3, max_seq_len=512)
    job = job.model_copy(update={"settings": job.settings.model_copy(update={"train_on": "all_assistant_turns"})})
    result = train_sft(job, Reporter())
    assert result.global_step == 3 and result.train_on == "all_assistant_turns" and result.rendering == "fallback"
    assert result.last_loss < result.first_loss and result.eval_tokens > 0
    metadata = result.metadata()
    assert metadata["train_on"] == "all_assistant_turns" and metadata["chat_template"] == "fallback"
    # the tokenizer saved with the adapter is the one trained with: merge, export and chat render with it
    saved = models.chain_tokenizer(str(tiny_model), [str(tmp_path / "out" / "adapter")])
    assert RENDERED_CALL in saved.apply_chat_template(tool_conversation(), tools=TOOLS, tokenize=False)
    assert "generation" in saved.chat_template


def test_each_rows_turns_and_tools_read_back_as_written():
    rows = tool_rows(2)
    rows[1]["prompt"][4]["tool_calls"][0]["function"]["arguments"] = {"town": "Rome", "days": 3}
    rows[1]["tools"] = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    plain = row_mapping.map_rows(pd.DataFrame({"q": ["q"], "a": ["a"]}), row_mapping.Mapping(prompt="q", response="a"))
    both = rows + plain
    # Arrow would give every call the keys of all of them (as nulls) and the row without tools a null
    by_turn = turns.training_dataset(both, "final_turn")
    assert [{k: v for k, v in r.items() if v is not None} for r in by_turn] == both
    every = turns.training_dataset(both, "all_assistant_turns")
    assert [r["messages"] for r in every] == [r["prompt"] + r["completion"] for r in both]
    assert [r["tools"] for r in every] == [rows[0]["tools"], rows[1]["tools"], None]
