"""The export of a model trained with tools: the Ollama TEMPLATE renders tools when the chat template does in fixed
text around schemas, calls and results (the fallback format does; the pieces compose what it renders), a template
that renders them otherwise gets a Modelfile without tool support and the reason, and the card lists the tools
the model was trained with."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from dragon_dagster.engine.release import card
from dragon_dagster.engine.release.export import chat_template, export_model, ollama, tool_template
from dragon_dagster.engine.tools import template

ORDERS_TOOLS = Path(__file__).resolve().parents[3] / "dragon_dagster" / "defs" / "orders" / "tools.py"
CALL = {"type": "function", "function": {"name": "order_status", "arguments": {"order_id": "A1042"}}}
CONVERSATION = [
    {"role": "system", "content": "You are the support assistant of an online shop."},
    {"role": "user", "content": "Where is my order A1042?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "order_status", "content": '{"order_id": "A1042", "status": "shipped"}'},
    {"role": "assistant", "content": "It has shipped."},
    {"role": "user", "content": "And B2000?"},
]
# Renders tools, but as names in prose and calls as "CALL name": nothing the Modelfile can say with Ollama's JSON.
PROSE_TOOLS = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def fallback(embedded_dir):
    """The embedded tokenizer with the fallback template, as a merged model of a pipeline with tools saves it."""
    from dragon_dagster.engine.models import load_tokenizer

    tokenizer = load_tokenizer(str(embedded_dir))
    assert template.prepare(tokenizer) == "fallback"
    return tokenizer


@pytest.fixture(scope="module")
def orders_schemas():
    from dragon_dagster.engine.tools.declare import Tools, Toolset

    return Toolset.from_settings(Tools(file=str(ORDERS_TOOLS))).schemas


def test_the_tool_pieces_compose_what_the_fallback_template_renders(fallback, orders_schemas):
    segments = chat_template.derive(fallback)
    pieces, why = tool_template.tool_support(fallback, segments)
    assert why is None and pieces.call_open == '<tool_call>\n{"name": "' and pieces.call_close == "}\n</tool_call>"
    assert pieces.results_open == "<|im_start|>user\n<tool_response>\n"
    assert "SmolLM" in pieces.start_tools_without_system  # the default system turn carries the tools too
    for messages in (CONVERSATION, CONVERSATION[1:], CONVERSATION[:4]):
        for prompt in (True, False):
            expected = fallback.apply_chat_template(
                messages, tools=orders_schemas, tokenize=False, add_generation_prompt=prompt
            )
            assert tool_template.render(segments, pieces, messages, orders_schemas, prompt) == expected


def test_the_modelfile_renders_tools_only_when_the_template_does(fallback, embedded_dir, tmp_path):
    from dragon_dagster.engine.models import load_tokenizer

    segments = chat_template.derive(fallback)
    pieces, _ = tool_template.tool_support(fallback, segments)
    text = ollama.modelfile("orders-q8_0.gguf", segments, ["<|im_end|>"], "Look orders up.", pieces).split('"""')[1]
    for part in ("{{ if $.Tools }}", "{{ range $j, $_ := .ToolCalls }}", "{{ .Function.Name }}", "{{ .Function }}"):
        assert part in text
    for piece in pieces.as_dict().values():  # every piece, as a Go string constant
        assert ollama.go_text(piece) in text
    assert '{{- else if eq .Role "tool" }}' in text and "{{- $prev = .Role }}" in text

    own = load_tokenizer(str(embedded_dir))  # SmolLM2's own template renders no tools
    assert tool_template.tool_support(own, chat_template.derive(own)) == (
        None,
        "the model's chat template renders no tools",
    )
    assert ".Tools" not in ollama.go_template(chat_template.derive(own))
    prose = copy.copy(own)
    prose.chat_template = PROSE_TOOLS
    assert template.renders_tools(prose)
    pieces, why = tool_template.tool_support(prose, chat_template.derive(prose))
    assert pieces is None and "as JSON" in why


def test_the_card_lists_the_tools_and_whether_the_modelfile_renders_them(orders_schemas):
    from dragon_dagster.engine.config.job import ToolsInput
    from dragon_dagster.engine.stages.export.worker import tool_descriptions
    from dragon_dagster.engine.tools.declare import Toolset

    tools = tool_descriptions(Toolset.from_input(ToolsInput(file=str(ORDERS_TOOLS))))
    assert tools == [{"name": "order_status", "description": orders_schemas[0]["function"]["description"]}]
    assert tool_descriptions(None) == []
    facts = {"base_model": "smollm2-135m", "license": "apache-2.0", "stages": [], "datasets": []}
    files = [{"file": "o-q8_0.gguf", "format": "q8_0", "size_mb": 1.0, "sha256": "ab"}]
    rendered = card.export_card(facts, "o", files, "o", None, None, tools=tools, modelfile_tools=True)
    assert "## Tools" in rendered and "- `order_status`: Look up the status of a customer's order." in rendered
    assert "The Modelfile renders tools as training did" in rendered
    refused = card.export_card(facts, "o", files, "o", None, None, tools=tools, modelfile_tools="it renders prose")
    assert "The Modelfile carries no tool support: it renders prose." in refused
    assert "## Tools" not in card.export_card(facts, "o", files, "o", None, None)


def test_export_of_a_model_with_the_fallback_template(tiny_model, fallback, tmp_path):
    """A merged model of a pipeline with tools carries the fallback template: its Modelfile renders tools, and the
    card lists the tools it trained with."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    fallback.save_pretrained(model)
    tools = [{"name": "order_status", "description": "Look up the status of a customer's order."}]
    info = export_model(model, tmp_path / "out", formats=["q8_0"], name="orders", tools=tools, verify=False)
    assert info["modelfile_tools"] is True and info["modelfile_tools_note"] is None and info["tools"] == tools
    assert "{{ range $j, $_ := .ToolCalls }}" in Path(info["modelfile"]).read_text()
    assert "- `order_status`: Look up the status" in Path(info["card"]).read_text()
    plain = export_model(tiny_model, tmp_path / "plain", formats=["q8_0"], name="plain", verify=False)
    assert plain["modelfile_tools"] is False and ".Tools" not in Path(plain["modelfile"]).read_text()


def test_the_export_stage_of_a_pipeline_with_tools(tiny_model, tmp_path):
    """SFT -> merge -> export through Dagster, the pipeline declaring order_status: the merged model saves the
    fallback template training rendered with, so the Modelfile renders tools; the job carries the tools (copied
    into the artifact) and the card lists them; the asset's metadata says both."""
    import shutil
    import textwrap

    from dagster import AssetKey, DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource
    from tests.support import failed_message

    shutil.copyfile(ORDERS_TOOLS, tmp_path / "tools.py")
    steps = "{max_steps: 1, batch_size: 2, grad_accum: 1, logging_steps: 1, max_seq_len: 512}"
    (tmp_path / "p.yaml").write_text(
        textwrap.dedent(f"""\
        name: orders_tiny
        model: {tiny_model}
        tools: {{file: tools.py, timeout: 5, max_calls: 2}}
        datasets:
          tickets: {{path: "example:tickets.csv"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {steps}, n_samples: 1, max_new_tokens: 4}}
          - {{name: merged_model, kind: merge}}
          - {{name: gguf_export, kind: export, formats: [q8_0]}}
        """)
    )
    runs = tmp_path / "runs"
    resources = {
        "store": ArtifactStore(runs_dir=str(runs)),
        "tracking": MLflowTracking(runs_dir=str(runs)),
        "training": TrainingResource(device="cpu"),
    }
    instance = DagsterInstance.ephemeral()
    outcome = materialize_pipeline(load(tmp_path / "p.yaml"), resources=resources, instance=instance)
    assert outcome["success"], failed_message(instance, outcome["run_id"])
    export = Path(outcome["artifacts"]["gguf_export"])
    assert (export / "tools" / "tools.py").read_text() == ORDERS_TOOLS.read_text()  # the job's own copy
    modelfile = (export / "gguf" / "Modelfile").read_text()
    assert "{{ if $.Tools }}" in modelfile and "{{ range $j, $_ := .ToolCalls }}" in modelfile
    readme = (export / "gguf" / "README.md").read_text()
    assert "- `order_status`: Look up the status of a customer's order." in readme
    assert "The Modelfile renders tools as training did" in readme
    metadata = instance.get_latest_materialization_event(
        AssetKey(["orders_tiny", "gguf_export"])
    ).asset_materialization.metadata
    assert metadata["tools"].value == "order_status" and metadata["modelfile_tools"].value == "rendered"
