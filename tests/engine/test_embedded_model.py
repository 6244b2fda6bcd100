"""The real embedded SmolLM2-135M: loads from the cached GGUF conversion, generates, trains a couple of steps."""

import pytest

from dragon_dagster.engine import models
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.infer import generation
from dragon_dagster.engine.stages.sft import worker as sft
from tests.support import sft_job as job
from tests.support import ticket_files

pytestmark = pytest.mark.slow


def test_embedded_model_generates_and_takes_sft_steps(embedded_dir, tmp_path):
    model = models.load_model(str(embedded_dir), models.Hardware(device="cpu"))
    tokenizer = models.load_tokenizer(str(embedded_dir))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    [reply] = generation.generate(
        model, tokenizer, [[{"role": "user", "content": "What is the capital of France?"}]], max_new_tokens=16
    )
    assert "Paris" in reply
    train, held = ticket_files(tmp_path, n=40)
    result = sft.train_sft(job(tmp_path, embedded_dir, train, held, max_steps=2, learning_rate=2e-4), Reporter())
    assert result.global_step == 2 and result.eval_loss < 5 and 1 < result.perplexity < 150
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").exists()
