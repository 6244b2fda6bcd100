"""GGUF export: the files load back with transformers' GGUF loader and reply as the merged model does (f16: logits
within F16_TOLERANCE; q8_0: at least Q8_AGREEMENT of greedy reply tokens the same), for a llama model of SmolLM2's
shape and a Qwen2 model (biases, untied output); the export's own verification of each file (q4_0 among them)
recorded and judged by the stage's check; the formats held to what the gguf package quantizes; the Ollama
template composes what the chat template renders; the export stage end to end in a pipeline; bad input named.

Loading a GGUF back is the slow part (gguf's reader parses the 49k-token vocabulary in Python, ~10 s a file on
2 cores), so each model is loaded once per format and the comparisons share it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from transformers.integrations.gguf.reader import read_gguf_metadata

from dragon_dagster.engine.release.export import ExportError, chat_template, export_model, ollama, verify
from dragon_dagster.engine.release.export.gguf_file import FORMATS, NOT_OFFERED, load_weights, permute, tensor_type
from tests.support import failed_message

F16_TOLERANCE = 0.05  # max |logit difference| of the f16 file against the float32 model (measured: 2e-4 on the
# tiny models, 0.041 on SmolLM2-135M's weights)
Q8_AGREEMENT = 0.9  # share of the model's greedy reply tokens the q8_0 file also picks (measured: 1.0 on the
# tiny models, 0.967 on SmolLM2-135M)
PROMPTS = [
    "My thermostat shows offline after the update.",
    "How do I reset the door lock?",
    "The hub blinks red. What does that mean?",
    "Can I share camera access with my family?",
    "What is 17 + 25?",
]
NEW_TOKENS = 12


def chat_ids(tokenizer, prompt: str):
    import torch

    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


def compare(
    reference_dir: Path, export_dir: Path, files: dict[str, str], prompts=PROMPTS, new_tokens=NEW_TOKENS
) -> dict:
    """Load each GGUF back and compare it with the model in reference_dir on the prompts: the largest logit
    difference along the reference's greedy replies, and the share of those reply tokens each file's own
    argmax agrees with (teacher-forced, so one early flip does not count every later token)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(reference_dir))
    runs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = chat_ids(tokenizer, prompt)
            out = reference.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            runs.append((out, ids.shape[1], reference(out).logits))
    figures = {}
    for fmt, name in files.items():
        model = AutoModelForCausalLM.from_pretrained(str(export_dir), gguf_file=name, dtype=torch.float32).eval()
        worst, agree, total = 0.0, 0, 0
        with torch.no_grad():
            for out, start, ref_logits in runs:
                logits = model(out).logits
                worst = max(worst, (logits - ref_logits).abs().max().item())
                picked = logits[0, start - 1 : -1].argmax(-1)
                agree += int((picked == out[0, start:]).sum())
                total += out.shape[1] - start
        figures[fmt] = {"max_logit_diff": worst, "token_agreement": agree / total, "tokens": total}
        del model
    return figures


def check_tokenizer(export_dir: Path, gguf_name: str, reference_dir: Path) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(export_dir), gguf_file=gguf_name)
    original = AutoTokenizer.from_pretrained(str(reference_dir))
    text = "Reset the hub: hold 10 s, then 333 blinks. <|im_end|> café"
    assert loaded(text)["input_ids"] == original(text)["input_ids"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert loaded.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == original.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# ------------------------------------------------------------------------------------------------ models


@pytest.fixture(scope="module")
def tiny_qwen2(embedded_dir, tmp_path_factory) -> Path:
    """A tiny random Qwen2 with the embedded tokenizer: q/k/v biases (set non-zero), untied output head."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from dragon_dagster.engine.models import load_tokenizer

    out = tmp_path_factory.mktemp("models") / "qwen2"
    tokenizer = load_tokenizer(str(embedded_dir))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                param.normal_(0, 0.5)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# ----------------------------------------------------------------------------------------- round trips


def test_llama_round_trip(tiny_model, tmp_path):
    """SmolLM2's shape (llama, tied embeddings, grouped-query attention, its tokenizer): the keys llama.cpp's
    converter writes, and both files reply as the model does."""
    info = export_model(tiny_model, tmp_path, name="tiny-llama", system="Be brief.")
    files = {f["format"]: f for f in info["files"]}
    assert [files[f]["file"] for f in files] == ["tiny-llama-f16.gguf", "tiny-llama-q8_0.gguf"]
    for f in files.values():  # the export's own verification: every prompt answered, the same replies
        assert f["agreement"]["prompts"] == len(verify.PROMPTS) and f["agreement"]["tokens"] > 0, f
        assert f["agreement"]["token_agreement"] >= Q8_AGREEMENT, f
    matrices = sum(w.size for w in load_weights(tiny_model).values() if w.ndim == 2)  # tied: no lm_head saved
    # every matrix: 2 bytes a weight in f16, 34 bytes a block of 32 in q8_0; norms f32 in both
    assert files["f16"]["size_bytes"] - files["q8_0"]["size_bytes"] == matrices * (2 - 34 / 32)
    metadata, tensors = read_gguf_metadata(str(tmp_path / "tiny-llama-q8_0.gguf"))
    assert "output.weight" not in tensors and "token_embd.weight" in tensors  # tied: llama.cpp reuses token_embd
    assert {
        k: metadata[k]
        for k in (
            "general.architecture",
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "llama.block_count",
            "llama.attention.head_count",
            "llama.attention.head_count_kv",
            "llama.rope.dimension_count",
            "general.file_type",
            "general.quantization_version",
        )
    } == {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "llama.block_count": 2,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 8,
        "general.file_type": 7,
        "general.quantization_version": 2,
    }
    assert metadata["tokenizer.ggml.tokens"] == metadata["llama.vocab_size"] == 49152
    assert "<|im_start|>" in metadata["tokenizer.chat_template"]
    assert (tmp_path / "Modelfile").exists() and info["ollama_create"].endswith(f"{tmp_path}/Modelfile")
    figures = compare(tiny_model, tmp_path, {"f16": files["f16"]["file"]})  # q8_0's replies: the export's own
    assert figures["f16"]["max_logit_diff"] < F16_TOLERANCE, figures


def test_q4_0_is_written_reloaded_and_its_agreement_recorded(tiny_model, tmp_path):
    """A q4_0 file: 4-bit blocks for the layers, the tied output matrix 8-bit and the norms 32-bit as llama.cpp
    keeps them; loaded back by the export itself, whose recorded agreement is what an independent reload finds."""
    import gguf

    info = export_model(tiny_model, tmp_path, formats=["q4_0"], name="tiny", ollama_files=False)
    (f,) = info["files"]
    assert f["file"] == "tiny-q4_0.gguf" and (tmp_path / "tiny-q4_0.gguf").exists()
    reader = gguf.GGUFReader(tmp_path / "tiny-q4_0.gguf")
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_down.weight"] == "Q4_0"
    assert types["token_embd.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_0
    agreement = f["agreement"]
    assert agreement["prompts"] == len(verify.PROMPTS) and 0 <= agreement["identical_replies"] <= agreement["prompts"]
    own = compare(tiny_model, tmp_path, {"q4_0": f["file"]}, verify.PROMPTS, verify.NEW_TOKENS)["q4_0"]
    assert agreement["token_agreement"] == round(own["token_agreement"], 4), (agreement, own)
    assert agreement["tokens"] == own["tokens"]
    card = (tmp_path / "README.md").read_text()
    assert f"| tiny-q4_0.gguf | q4_0 | {f['size_mb']} | {agreement['identical_replies']}/5 | " in card


def test_tensor_types_fall_back_as_llama_cpp_does():
    import numpy as np

    matrix, odd, norm = np.zeros((8, 64)), np.zeros((8, 48)), np.zeros(64)
    assert tensor_type("blk.0.attn_norm.weight", norm, "q4_0", tied=True).name == "F32"
    assert tensor_type("blk.0.attn_q.weight", matrix, "q4_0", tied=True).name == "Q4_0"
    assert tensor_type("blk.0.attn_q.weight", odd, "q4_0", tied=True).name == "F16"  # 48 is not a 32-block row
    assert tensor_type("token_embd.weight", matrix, "q5_1", tied=True).name == "Q8_0"  # tied: the output too
    assert tensor_type("token_embd.weight", matrix, "q5_1", tied=False).name == "Q5_1"
    assert tensor_type("output.weight", matrix, "q4_1", tied=False).name == "Q8_0"
    assert tensor_type("output.weight", matrix, "bf16", tied=False).name == "BF16"
    assert tensor_type("output.weight", odd, "f16", tied=False).name == "F16"


def test_formats_are_what_the_gguf_package_quantizes():
    """Every type the installed gguf quantizes in Python is offered or refused with a reason, and each offered
    one has a quantizer and a llama.cpp file type: a gguf upgrade that adds one fails here until it is decided."""
    import gguf
    from gguf.quants import _type_traits

    quantizable = {t.name.lower() for t, q in _type_traits.items() if "quantize_blocks" in vars(q)}
    assert quantizable | {"f16"} == set(FORMATS) | set(NOT_OFFERED), quantizable
    assert not set(FORMATS) & set(NOT_OFFERED)
    for fmt in FORMATS:
        assert gguf.LlamaFileType[f"MOSTLY_{fmt.upper()}"], fmt


def test_qwen2_round_trip(tiny_qwen2, tmp_path):
    info = export_model(tiny_qwen2, tmp_path, name="tiny-qwen")
    assert info["architecture"] == "qwen2"
    files = {f["format"]: f["file"] for f in info["files"]}
    metadata, tensors = read_gguf_metadata(str(tmp_path / files["f16"]))
    assert {"output.weight", "blk.0.attn_q.bias", "blk.1.attn_v.bias"} <= set(tensors)
    assert "qwen2.vocab_size" not in metadata and metadata["qwen2.block_count"] == 2
    assert metadata["tokenizer.ggml.pre"] == "qwen2"  # a Qwen2 tokenizer's split rule over SmolLM2's vocabulary
    figures = compare(tiny_qwen2, tmp_path, files)
    assert figures["f16"]["max_logit_diff"] < F16_TOLERANCE, figures
    assert figures["q8_0"]["token_agreement"] >= Q8_AGREEMENT, figures
    check_tokenizer(tmp_path, files["q8_0"], tiny_qwen2)  # the qwen2 split rule rebuilt from tokenizer.ggml.pre


@pytest.mark.slow
def test_smollm2_real_weights(embedded_dir, tmp_path):
    """The embedded SmolLM2-135M-Instruct itself; metadata keys as llama.cpp's converter wrote them in the
    embedded GGUF (its vocabulary, merges and token types identical)."""
    import gguf

    from dragon_dagster.engine.models import embedded_gguf

    # verify=False: compare() below loads each file back itself and checks more (logits, teacher-forced agreement)
    # than the export's own check, which test_q4_0_is_written_reloaded_and_its_agreement_recorded covers
    info = export_model(embedded_dir, tmp_path, name="smollm2", verify=False)
    files = {f["format"]: f["file"] for f in info["files"]}
    ours, theirs = gguf.GGUFReader(tmp_path / files["q8_0"]), gguf.GGUFReader(embedded_gguf())
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.chat_template",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
        "llama.block_count",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
        "llama.vocab_size",
        "llama.rope.dimension_count",
        "llama.context_length",
        "general.license",
    ):
        assert ours.fields[key].contents() == theirs.fields[key].contents(), key
    figures = compare(embedded_dir, tmp_path, files)
    print("smollm2", info["seconds"], [(f["format"], f["size_mb"]) for f in info["files"]], figures)
    assert figures["f16"]["max_logit_diff"] < F16_TOLERANCE, figures
    assert figures["q8_0"]["token_agreement"] >= Q8_AGREEMENT, figures


def test_permute_is_what_transformers_reverses():
    """Our q/k permutation is undone by transformers' GGUF loader's reverse permutation, for GQA k too."""
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    processor = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 2})
    q, k = np.random.rand(32, 32).astype(np.float32), np.random.rand(16, 32).astype(np.float32)
    back_q = processor.process(weights=permute(q, 4, 4), name="blk.0.attn_q.weight").weights
    back_k = processor.process(weights=permute(k, 4, 2), name="blk.0.attn_k.weight").weights
    assert np.array_equal(back_q, q) and np.array_equal(back_k, k)


# ------------------------------------------------------------------------------------ chat template, Ollama

LLAMA3_STYLE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' + system + '<|eot_id|>' }}"
    "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content']"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
SYSTEM_IN_FIRST_TURN = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns = m['content'] %}{% else %}"
    "{{ '<turn>' + m['role'] + '\\n' + m['content'] + '</turn>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<turn>assistant\\n' }}{% endif %}"
)
REVERSED = (
    "{% for m in messages|reverse %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "user", "content": "The lamp will not pair."},
    {"role": "assistant", "content": "Hold the button for 10 seconds."},
    {"role": "user", "content": "It blinks blue now.\nWhat next?"},
    {"role": "assistant", "content": "Open the app and add it again."},
    {"role": "user", "content": "Done, thanks!"},
]


@pytest.fixture(scope="module")
def tokenizer(embedded_dir):
    from dragon_dagster.engine.models import load_tokenizer

    return load_tokenizer(str(embedded_dir))


@pytest.mark.parametrize("template", [None, LLAMA3_STYLE], ids=["smollm2", "llama3-style"])
def test_segments_reproduce_the_chat_template(tokenizer, template):
    import copy

    tok = copy.copy(tokenizer)
    if template:
        tok.chat_template = template
    segments = chat_template.derive(tok)
    for messages in (CONVERSATION, CONVERSATION[1:], CONVERSATION[:-1], CONVERSATION[1:2]):
        for prompt in (True, False):
            assert chat_template.render(segments, messages, prompt) == tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=prompt
            )


def test_modelfile_for_smollm2(tokenizer, tmp_path):
    segments = chat_template.derive(tokenizer)
    assert segments.user_prefix == "<|im_start|>user\n" and segments.assistant_suffix == "<|im_end|>\n"
    assert "You are a helpful AI assistant named SmolLM" in segments.start_without_system  # its default system
    stops = chat_template.stop_tokens(tokenizer, segments)
    assert stops == ["<|im_end|>"]
    path = ollama.write_modelfile(tmp_path, "support-q8_0.gguf", segments, stops, "Be warm.")
    text = path.read_text()
    assert text.startswith('FROM ./support-q8_0.gguf\nTEMPLATE """{{- range $i, $_ := .Messages }}')
    assert 'PARAMETER stop "<|im_end|>"' in text and text.endswith('SYSTEM """Be warm."""\n')
    assert '{{ "<|im_start|>user\\n" }}{{ .Content }}{{ "<|im_end|>\\n" }}' in text  # newlines kept as \n in Go
    assert ollama.create_command(tmp_path, "support") == f"ollama create support -f {tmp_path}/Modelfile"


@pytest.mark.parametrize("template", [SYSTEM_IN_FIRST_TURN, REVERSED], ids=["drops-system", "reversed"])
def test_template_that_is_not_per_message_is_refused(tokenizer, template):
    import copy

    tok = copy.copy(tokenizer)
    tok.chat_template = template
    with pytest.raises(ExportError, match="per-message concatenation|system"):
        chat_template.derive(tok)


# ------------------------------------------------------------------------------------------------- cards


def test_cards_from_manifests(tmp_path):
    from dragon_dagster.engine.artifacts.manifest import AdapterManifest, DatasetManifest, write_manifest
    from dragon_dagster.engine.release import card
    from dragon_dagster.engine.stages.evaluate.result import ReportResult
    from dragon_dagster.engine.stages.sft.result import SFTResult

    data = tmp_path / "artifacts" / "p" / "sft_dataset" / "r1"
    adapter = tmp_path / "artifacts" / "p" / "sft_adapter" / "r1"
    for directory in (data, adapter / "adapter"):
        directory.mkdir(parents=True)
    write_manifest(
        data,
        DatasetManifest(kind="chat_dataset", source="/data/tickets.csv", settings={}, train_rows=190, eval_rows=10),
    )
    write_manifest(
        adapter,
        AdapterManifest[SFTResult](
            stage="sft_adapter",
            method="sft",
            base_model="smollm2-135m",
            resolved_model="/cache/smollm2",
            chain=[str(adapter / "adapter")],
            dataset=str(data),
            settings={"kind": "sft", "lora": {"r": 8, "alpha": 16}, "args": {"epochs": 2}},
            result=SFTResult(objective="sft", held_out=True, eval_loss=1.25, metrics={"token_f1": 0.5}, speed={}),
        ),
    )
    facts = card.card_facts([str(adapter / "adapter")], "/cache/smollm2")
    merged = card.merged_card(facts, "smollm2-135m + sft_adapter")
    assert merged.startswith(
        "---\nlicense: apache-2.0\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n"
        "tags: [dragon-dagster, lora, merged]\n---\n"
    )
    assert "| sft_adapter | sft | sft_dataset | lora.r: 8; lora.alpha: 16; epochs: 2 |" in merged
    assert "| sft_adapter | True | 1.25 | 0.5 |" in merged  # held_out, eval_loss, metrics/token_f1
    assert "- sft_dataset (chat_dataset): 190 training and 10 held-out rows, from `/data/tickets.csv`" in merged
    report = ReportResult(
        task="chat",
        rows=10,
        held_out=True,
        base={"eval_loss": 2.0, "metrics": {"token_f1": 0.1}},
        merged={"eval_loss": 1.5, "metrics": {"token_f1": 0.4}},
        merged_not_worse=True,
    )
    files = [{"file": "p-q8_0.gguf", "format": "q8_0", "size_mb": 145.0, "sha256": "ab"}]
    exported = card.export_card(facts, "p", files, "p", "Be kind.", report.card_table())
    assert "| eval_loss | 2 | 1.5 |" in exported and "| token_f1 | 0.1 | 0.4 |" in exported
    assert "ollama create p -f Modelfile" in exported and 'llama-cli -m p-q8_0.gguf -cnv -sys "Be kind."' in exported
    local = tmp_path / "base"
    local.mkdir()
    (local / "README.md").write_text("---\nlicense: mit\ntags: [x]\n---\n# A model\n")
    assert card.license_of(str(local)) == "mit" and card.hub_id(str(local)) is None
    assert card.license_of(str(tmp_path / "nowhere")) == "unknown"


def test_agreement_check_flags_a_file_under_the_floor(tmp_path):
    from dragon_dagster.engine.artifacts.manifest import ExportedFile, ExportManifest, ReplyAgreement, write_manifest
    from dragon_dagster.engine.stages.export.checks import agreement_check

    def exported(fmt: str, token_agreement: float | None) -> ExportedFile:
        agreement = (
            ReplyAgreement(
                prompts=5, identical_replies=2, reply_agreement=0.4, tokens=80, token_agreement=token_agreement
            )
            if token_agreement is not None
            else None
        )
        path = str(tmp_path / f"p-{fmt}.gguf")
        return ExportedFile(
            file=f"p-{fmt}.gguf", format=fmt, path=path, size_bytes=1, size_mb=0.0, sha256="x", seconds=0.1,
            agreement=agreement,
        )  # fmt: skip

    def judge(*files: ExportedFile, floor: float = 0.9):
        artifact = tmp_path / "artifact"
        artifact.mkdir(exist_ok=True)
        write_manifest(
            artifact,
            ExportManifest(merged="m", settings={}, name="p", architecture="llama", files=list(files), seconds=1),
        )
        return agreement_check(floor).judge(artifact)

    passed = judge(exported("f16", 1.0), exported("q8_0", 0.95))
    assert passed.passed and passed.metadata["q8_0_token_agreement"] == 0.95
    assert passed.metadata["q8_0_identical_replies"] == "2/5"
    failed = judge(exported("q8_0", 0.95), exported("q4_0", 0.6))
    assert not failed.passed and failed.severity == "warn"
    assert "q4_0 (60.0%)" in failed.description and "min_token_agreement=0.9" in failed.description
    assert "q8_0" not in failed.description.split("under")[0]
    assert judge(exported("q4_0", 0.6), floor=0.5).passed
    unverified = judge(exported("q8_0", None))
    assert not unverified.passed and "q8_0 not verified" in unverified.description


# ---------------------------------------------------------------------------------------------- bad input


def test_unknown_format_and_architecture(tiny_model, tmp_path):
    with pytest.raises(ExportError, match=r"unknown GGUF format.*q4_k.*known: f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0"):
        export_model(tiny_model, tmp_path / "a", formats=["q4_k"])
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ExportError, match="cannot export a GPT2LMHeadModel model.*LlamaForCausalLM"):
        export_model(gpt2, tmp_path / "b")
    with pytest.raises(ExportError, match="no config.json"):
        export_model(tmp_path / "nowhere", tmp_path / "c")


def test_export_stage_validation(tiny_model):
    from dragon_dagster.engine.pipeline import PipelineError, parse

    def pipeline(*extra):
        return parse(
            {
                "name": "p",
                "model": str(tiny_model),
                "stages": [
                    {
                        "name": "sft_dataset",
                        "kind": "chat_dataset",
                        "path": "example:tickets.csv",
                        "prompt": "{subject}",
                        "response": "reply",
                    },
                    {"name": "sft_adapter", "kind": "sft", "dataset": "sft_dataset"},
                    *extra,
                ],
            }
        )

    with pytest.raises(PipelineError, match="has no merge stage before it to export"):
        pipeline({"name": "gguf", "kind": "export"})
    with pytest.raises(PipelineError, match="model 'sft_adapter' is a sft stage, not a merge stage"):
        pipeline({"name": "merged", "kind": "merge"}, {"name": "gguf", "kind": "export", "model": "sft_adapter"})
    with pytest.raises(PipelineError, match=r"formats\[0\].*'f16', 'bf16', 'q8_0', 'q5_1', 'q5_0', 'q4_1' or 'q4_0'"):
        pipeline({"name": "merged", "kind": "merge"}, {"name": "gguf", "kind": "export", "formats": ["q4"]})
    with pytest.raises(PipelineError, match="lists a format twice"):
        pipeline({"name": "merged", "kind": "merge"}, {"name": "gguf", "kind": "export", "formats": ["f16", "f16"]})
    ok = pipeline(
        {"name": "merged", "kind": "merge"},
        {"name": "gguf", "kind": "export"},
        {"name": "report", "kind": "evaluate", "dataset": "sft_dataset"},
    )
    assert ok.upstream("gguf") == ["merged", "report"]  # the report listed after the export is still waited for


# ------------------------------------------------------------------------------------ the stage in a pipeline

STEPS = "{max_steps: 4, batch_size: 4, grad_accum: 1, logging_steps: 2, max_seq_len: 128, learning_rate: 5.0e-3}"


@pytest.mark.slow
def test_export_stage_end_to_end(tiny_model, tmp_path):
    """SFT -> merge -> evaluate -> export through Dagster: GGUF files, Modelfile with the dataset's system prompt,
    model cards in the merged model and the export (with the evaluation table), metadata; and the exported
    files reply as the merged model does."""
    from dagster import AssetKey, DagsterInstance

    from dragon_dagster.assets.launch import materialize_pipeline
    from dragon_dagster.engine.artifacts.manifest import ExportManifest, read_manifest
    from dragon_dagster.engine.pipeline import load
    from dragon_dagster.resources import ArtifactStore, MLflowTracking, TrainingResource

    (tmp_path / "p.yaml").write_text(
        textwrap.dedent(f"""\
        name: shop
        model: {tiny_model}
        datasets:
          tickets: {{path: "example:tickets.csv"}}
        stages:
          - {{name: sft_dataset, kind: chat_dataset, source: tickets, prompt: "{{subject}}", response: reply,
              system: "You are a concise support agent."}}
          - {{name: sft_adapter, kind: sft, dataset: sft_dataset, args: {STEPS}, n_samples: 1, max_new_tokens: 4}}
          - {{name: merged_model, kind: merge}}
          - {{name: evaluation_report, kind: evaluate, dataset: sft_dataset, max_eval_rows: 4, n_samples: 1,
              n_judge: 0, max_new_tokens: 4}}
          - {{name: gguf_export, kind: export}}
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

    merged = Path(outcome["artifacts"]["merged_model"])
    merged_card = (merged / "model" / "README.md").read_text()
    assert merged_card.startswith("---\nlicense: unknown\ntags: [dragon-dagster, lora, merged]\n---")
    assert "| sft_adapter | sft | sft_dataset |" in merged_card and "eval_loss" in merged_card

    export = Path(outcome["artifacts"]["gguf_export"])
    manifest = read_manifest(export, ExportManifest)
    gguf_dir = export / "gguf"
    assert sorted(p.name for p in gguf_dir.iterdir()) == ["Modelfile", "README.md", "shop-f16.gguf", "shop-q8_0.gguf"]
    assert manifest.kind == "gguf_export" and manifest.ollama_create == f"ollama create shop -f {gguf_dir}/Modelfile"
    modelfile = (gguf_dir / "Modelfile").read_text()
    assert (
        modelfile.startswith("FROM ./shop-q8_0.gguf\n") and 'SYSTEM """You are a concise support agent."""' in modelfile
    )
    card = (gguf_dir / "README.md").read_text()
    assert "## Evaluation" in card and "| eval_loss |" in card and "ollama create shop -f Modelfile" in card
    event = instance.get_latest_materialization_event(AssetKey(["shop", "gguf_export"]))
    metadata = event.asset_materialization.metadata
    assert metadata["ollama_create"].value == manifest.ollama_create
    assert metadata["q8_0_sha256"].value == manifest.files[1].sha256
    assert metadata["f16_size_mb"].value > metadata["q8_0_size_mb"].value
    # the stage verified its files: the figures in the manifest, the metadata, the card, and the check on them
    for f in manifest.files:
        assert f.agreement.token_agreement >= Q8_AGREEMENT, f
        assert metadata[f"{f.format}_token_agreement"].value == f.agreement.token_agreement
        assert f"| {f.file} | {f.format} | {f.size_mb} | {f.agreement.identical_replies}/5 | " in card
    (check,) = [c for c in outcome["checks"] if c["name"] == "gguf_replies_agree"]
    assert check["passed"] and check["asset"] == "shop/gguf_export", check

    figures = compare(merged / "model", gguf_dir, {"f16": "shop-f16.gguf"})
    assert figures["f16"]["max_logit_diff"] < F16_TOLERANCE, figures
    check_tokenizer(gguf_dir, "shop-q8_0.gguf", merged / "model")
