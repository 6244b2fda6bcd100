"""Release a merged model: GGUF files (f16 and q8_0 by default; bf16 and 5- and 4-bit ones on request) with the
tokenizer and chat template inside, each loaded back and its replies compared with the model's, an Ollama
Modelfile beside them, and a model card. No Dagster here; usable from a notebook or the CLI:

    from dragon_dagster.engine.release.export import export_model, ollama
    info = export_model("runs/artifacts/support/merged_model/<run>", "out/support-gguf", name="support")
    print(ollama.create_command(info["export_dir"], "support"))

Why the `gguf` package's writer and not llama.cpp's converter: llama.cpp's `convert_hf_to_gguf.py` is not on
the package index. `llama-cpp-python` is, as a source package only: its 76 MB sdist (0.3.36) does ship
`vendor/llama.cpp/convert_hf_to_gguf.py` and the `conversion/` modules it imports, but installing it compiles
llama.cpp for minutes, and the converter is not installed with it, so we would be unpacking a script from an
sdist and running it against a `gguf` version it was not released with. The writer in `gguf` (the same
package the converter writes with, maintained in llama.cpp's tree) is a pure-Python wheel we already depend
on through transformers' GGUF loader. The cost is doing the converter's per-architecture work ourselves, for
the architectures our presets use: llama (SmolLM2, Llama 3.2; the q/k weights permuted for llama.cpp's rope)
and qwen2 (Qwen2.5; q/k/v biases, no permutation). The metadata keys mirror what the converter writes
(checked against the embedded SmolLM2 GGUF, which llama.cpp's converter made), and the export loads every file
back with transformers' GGUF loader and records how often its greedy replies are the merged model's.

Modules, one job each: gguf_file.py (weights and model metadata), vocab.py (tokenizer metadata),
chat_template.py (a Jinja chat template as per-role segments), tool_template.py (its tool parts, when it renders
tools as fixed text), ollama.py (Modelfile, `ollama create`), verify.py (each file reloaded against the model),
model.py (the export itself), errors.py (ExportError); the cards are ../card.py, the `export` stage kind's
worker is stages/export/.
"""

from .errors import ExportError
from .gguf_file import FORMATS, SUPPORTED_ARCHITECTURES
from .model import export_model

__all__ = ["FORMATS", "SUPPORTED_ARCHITECTURES", "ExportError", "export_model"]
