"""The fast paths learn what the plain path learns: same loss, same gradients, same log-probabilities.

Packing must keep sequences from attending to each other; the chunked head must give transformers' loss and
TRL's log-probabilities; and the speed settings reach the trainers per device.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dragon_dagster.engine.spec.stages import GRPO
from dragon_dagster.engine.train import lm_head, sft
from dragon_dagster.engine.reporter import Reporter
from dragon_dagster.engine.spec.settings import SettingsError, Speed, build
from tests.test_engine_training import job, ticket_files

ROOT = Path(__file__).resolve().parents[1]


def small_lora_model(vocab=300, seed=0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                lora_dropout=0.0))
    for name, param in model.named_parameters():  # LoRA B starts at zero; make the adapter matter
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    return model


def examples(vocab=300, lengths=(9, 14, 6, 11), prompt=4, seed=1):
    """Prompt-completion rows as TRL's dataset preparation leaves them: labels are -100 on the prompt."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def collate(rows, padding_free: bool):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(rows)


def lora_grads(model) -> dict:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return grads


def assert_same_grads(a: dict, b: dict, tol=1e-5):
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.allclose(a[name], b[name], atol=tol, rtol=1e-4), name


def test_chunked_loss_equals_transformers_loss_and_gradients():
    model = small_lora_model()
    padded = collate(examples(), padding_free=False)
    plain = model(**padded).loss  # transformers' ForCausalLMLoss on the same labels
    plain.backward()
    expected = lora_grads(model)
    for chunk in (3, 1024):  # several chunks, and one
        lm_head.CHUNK_TOKENS = chunk
        try:
            loss, counts = lm_head.causal_lm_loss(model, padded, padded["labels"])
        finally:
            lm_head.CHUNK_TOKENS = 1024
        assert loss.item() == pytest.approx(plain.item(), rel=1e-5)
        loss.backward()
        assert_same_grads(lora_grads(model), expected)
    assert counts["tokens"] == int((padded["labels"][:, 1:] != -100).sum()) > 0
    # under gradient accumulation the trainer divides by the tokens of all micro-batches
    halved, _ = lm_head.causal_lm_loss(model, padded, padded["labels"], num_items_in_batch=2 * counts["tokens"])
    assert halved.item() == pytest.approx(plain.item() / 2, rel=1e-5)


def test_packed_rows_give_the_padded_loss_because_sequences_do_not_attend_to_each_other():
    model = small_lora_model()
    rows = examples()
    padded, packed = collate(rows, padding_free=False), collate(rows, padding_free=True)
    assert packed["input_ids"].shape[0] == 1 and "attention_mask" not in packed  # one row, no padding
    plain = model(**padded).loss
    plain.backward()
    expected = lora_grads(model)
    fast, _ = lm_head.causal_lm_loss(model, packed, packed["labels"])
    assert fast.item() == pytest.approx(plain.item(), rel=1e-5)
    fast.backward()
    assert_same_grads(lora_grads(model), expected)
    # the control: one long sequence (positions running on) lets later rows see earlier ones, and the loss moves
    leaky = {"input_ids": packed["input_ids"], "position_ids": torch.arange(packed["input_ids"].shape[1])[None]}
    wrong, _ = lm_head.causal_lm_loss(model, leaky, packed["labels"])
    assert abs(wrong.item() - plain.item()) > 1e-3


def test_completion_logprobs_match_trl_fused_head_values_and_gradients():
    from trl.trainer.utils import add_fused_lm_head

    model = small_lora_model()
    ids = torch.randint(0, 300, (3, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded prompt
    mask[2, -2:] = 0  # a completion that ended early
    n, temperature = 5, 0.7
    weights = torch.randn(3, n)
    logps, entropy = lm_head.completion_logprobs(model, ids, mask, n, temperature, chunk=4)
    (logps * weights).sum().backward()
    ours = lora_grads(model)
    add_fused_lm_head(model.get_base_model(), temperature=temperature, outputs=("log_probs", "entropy"))
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-n] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    trl_logps, trl_entropy = out.log_probs[:, -n:], out.entropy[:, -n:]
    assert torch.allclose(logps, trl_logps, atol=1e-5)
    assert torch.allclose(entropy, trl_entropy, atol=1e-4)
    (trl_logps * weights).sum().backward()
    assert_same_grads(ours, lora_grads(model))


def progress_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]


def sft_losses(tmp_path, tiny_model, train, held, kernel: str) -> list[float]:
    (tmp_path / kernel).mkdir()
    run = job(tmp_path / kernel, tiny_model, train, held, max_steps=4, grad_accum=2, learning_rate=5e-2)
    run.speed = {"loss_kernel": kernel, "packing": "off"}
    assert sft.train_sft(run, Reporter())["speed"]["loss_kernel"] == kernel  # the path asked for is the one taken
    return [r["loss"] for r in progress_rows(tmp_path / kernel / "out") if r.get("loss") is not None]


def test_sft_with_the_chunked_head_trains_exactly_like_trl(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path, n=40)
    trl_losses = sft_losses(tmp_path, tiny_model, train, held, "trl")
    chunked_losses = sft_losses(tmp_path, tiny_model, train, held, "chunked")
    assert len(trl_losses) >= 3
    assert chunked_losses == pytest.approx(trl_losses, rel=1e-4)  # same loss, same updates, step after step


def grpo_rows_logged(tmp_path, tiny_model, kernel: str) -> list[dict]:
    from dragon_dagster.engine.data import tables as data
    from dragon_dagster.engine.train.grpo import GRPOJob, train_grpo
    from dragon_dagster.engine.spec.pipeline import EXAMPLE_DIR

    work = tmp_path / kernel
    (work / "out").mkdir(parents=True)
    prompts = data.map_prompts(data.read_table(EXAMPLE_DIR / "arithmetic.csv"),
                               data.PromptsMapping(prompt="question", reference="answer"))[:16]
    data.write_jsonl(work / "prompts.jsonl", prompts)
    settings = GRPO(name="grpo_adapter", kind="grpo", dataset="prompts",
                    args={"max_steps": 2, "batch_size": 2, "grad_accum": 1, "logging_steps": 1, "save_steps": 100,
                          "learning_rate": 5e-2, "warmup_ratio": 0.0},
                    rewards=[{"type": "length", "max_chars": 24}], group_size=8, beta=0.04, temperature=0.7,
                    max_new_tokens=6, max_eval_prompts=2, n_samples=1)
    run = GRPOJob(settings=settings, model=str(tiny_model), train_file=str(work / "prompts.jsonl"),
                  output_dir=str(work / "out"), checkpoint_dir=str(work / "ckpt"), hardware={"device": "cpu"},
                  # one sampling round for both steps: step 2 weighs the same samples against step 1's update
                  speed={"loss_kernel": kernel, "generation_batch_size": 32})
    result = train_grpo(run, Reporter())
    assert result["speed"] == {"loss_kernel": kernel, "generation_batch_size": 32}
    return [r for r in progress_rows(work / "out") if r.get("grad_norm") is not None]


def test_grpo_with_chunked_log_probs_trains_exactly_like_trl(tiny_model, tmp_path):
    trl_rows = grpo_rows_logged(tmp_path, tiny_model, "trl")
    chunked_rows = grpo_rows_logged(tmp_path, tiny_model, "chunked")
    assert [r["step"] for r in trl_rows] == [1, 2]
    assert trl_rows[0]["reward_std"] > 0 and trl_rows[0]["grad_norm"] > 0  # the rewards disagree: a real gradient
    assert trl_rows[1]["kl"] > 0 and trl_rows[1]["loss"] != 0  # step 2 is off its sampling policy
    assert chunked_rows[0]["reward"] == trl_rows[0]["reward"]  # the same samples
    for key in ("grad_norm", "loss", "kl", "entropy"):
        assert [r.get(key) for r in chunked_rows] == pytest.approx([r.get(key) for r in trl_rows], rel=1e-3,
                                                                    abs=1e-6), key


def test_grpo_generation_batch_must_hold_whole_steps(tiny_model, tmp_path):
    from dragon_dagster.engine.train.grpo import GRPOJob, train_grpo

    settings = GRPO(name="grpo_adapter", kind="grpo", dataset="prompts", args={"batch_size": 2}, group_size=4,
                    rewards=[{"type": "length", "max_chars": 5}])
    run = GRPOJob(settings=settings, model=str(tiny_model), train_file=str(tmp_path / "none.jsonl"),
                  output_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"), speed={"generation_batch_size": 12})
    with pytest.raises(ValueError, match=r"generation_batch_size \(12\) must be a multiple .* = 8"):
        train_grpo(run, Reporter())


def test_sft_packing_trains_and_says_so(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path, n=40)
    run = job(tmp_path, tiny_model, train, held, max_steps=2)
    run.speed = {"packing": "on"}

    class Lines(Reporter):
        def __init__(self):
            super().__init__()
            self.lines = []

        def log(self, message):
            self.lines.append(message)

    reporter = Lines()
    result = sft.train_sft(run, reporter)
    assert result["global_step"] == 2 and (tmp_path / "out" / "adapter" / "adapter_config.json").exists()
    assert any("packing on" in line for line in reporter.lines)


def test_speed_settings_resolve_per_device_and_name_bad_values():
    assert Speed().resolve("cuda") == Speed(packing="on", loss_kernel="trl")
    assert Speed().resolve("cpu") == Speed(packing="off", loss_kernel="chunked")
    assert Speed(packing="off", loss_kernel="chunked").resolve("cuda").packing == "off"  # overrides win
    with pytest.raises(SettingsError, match="speed.packing"):
        build(Speed, {"packing": "yes"}, "speed")
    with pytest.raises(SettingsError, match="speed.generation_batch_size"):
        build(Speed, {"generation_batch_size": 0}, "speed")
    with pytest.raises(SettingsError, match="unknown setting"):
        build(Speed, {"pack": "on"}, "speed")


def test_training_resource_sends_speed_to_trainer_jobs_only(tmp_path):
    from dagster import build_asset_context

    from dragon_dagster.resources import TrainingResource

    resource = TrainingResource(device="cpu", loss_kernel="trl", generation_batch_size=64,
                                python=sys.executable)
    assert resource.speed() == {"packing": "auto", "loss_kernel": "trl", "generation_batch_size": 64,
                                "torch_compile": False}
    seen = {}
    for kind in ("sft", "merge"):
        (tmp_path / kind).mkdir()
        with pytest.raises(Exception):  # the jobs are empty: the worker fails, but the job file stays
            resource.run_job(build_asset_context(), {"settings": {"kind": kind}}, tmp_path / kind)
        seen[kind] = json.loads((tmp_path / kind / "job.json").read_text())
    assert seen["sft"]["speed"]["loss_kernel"] == "trl" and "speed" not in seen["merge"]


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT.parent / "shared" / "bench" / "anchor_trl.py").exists(),
                    reason="the peer script ../shared/bench/anchor_trl.py is not beside this checkout")
def test_benchmark_compares_with_plain_trl_in_one_run(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_trl.py"), "--only", "sft,grpo",
                          "--steps", "4", "--bs", "4", "--gen-bs", "8", "--comp", "8",
                          "--json", str(tmp_path / "bench.json")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    measured = json.loads((tmp_path / "bench.json").read_text())["measured"]
    for side in ("trl_sft", "ours_sft", "trl_grpo", "ours_grpo"):
        assert measured[side]["peak_gib"] > 0
    assert measured["ours_sft"]["tokens_per_s"] > 0 and measured["ours_grpo"]["completions_per_s"] > 0
    assert "| sft trained tokens/s |" in out.stdout and "x |" in out.stdout


def _custom(payload) -> dict:
    return {"__dagster_pipes_version": "0.1", "method": "report_custom_message", "params": {"payload": payload}}


def test_pipes_tap_takes_metrics_and_outcome_and_passes_the_rest_on():
    from dragon_dagster.resources.launcher import PipesTap, _TappedHandler

    seen, passed = [], []

    class Handler:
        def handle_message(self, message):
            passed.append(message)

    tap = PipesTap(lambda step, values: seen.append((step, values)))
    handler = _TappedHandler(Handler(), tap)
    log = {"__dagster_pipes_version": "0.1", "method": "log", "params": {"message": "hi", "level": "INFO"}}
    for message in (_custom({"kind": "metrics", "step": 1, "values": {"train/loss": 2.5}}), log,
                    _custom({"note": "not ours"}),
                    _custom({"kind": "outcome", "event": "result", "result": {"steps": 3}})):
        handler.handle_message(message)
    assert seen == [(1, {"train/loss": 2.5})]
    assert tap.outcome == {"event": "result", "result": {"steps": 3}}
    assert passed == [log, _custom({"note": "not ours"})]  # Dagster still gets its own and the user's


def test_pipes_tap_skips_metrics_it_cannot_log_and_keeps_going():
    from dragon_dagster.resources.launcher import PipesTap

    seen, warnings = [], []

    def log(step, values):
        if step == 2:
            raise ConnectionError("tracking server unreachable")
        seen.append(step)

    tap = PipesTap(log, warn=warnings.append)
    for message in (_custom({"kind": "metrics", "step": 1, "values": {}}),
                    _custom({"kind": "metrics", "step": "not a step", "values": {}}),
                    _custom({"kind": "metrics", "step": 2, "values": {}}),
                    _custom({"kind": "metrics", "step": 3, "values": {}})):
        assert tap.take(message)
    assert seen == [1, 3] and tap.failures == 2
    assert len(warnings) == 1 and "could not forward" in warnings[0]  # said once, not per line


def test_the_worker_command_per_launcher_and_workers():
    from dragon_dagster.resources import TrainingResource

    training = {"settings": {"kind": "sft"}}
    one = TrainingResource().command("/runs/x/.job-run.json", training)
    assert one == [sys.executable, "-m", "dragon_dagster.engine.worker", "/runs/x/.job-run.json"]
    resource = TrainingResource(workers=2, termination_timeout_s=300)
    two = resource.command("/j.json", {**training, "parallel": resource.parallel()})
    # torchrun stops its ranks before the resource kills the agent's group, which does not hold them
    assert two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--shutdown-timeout=290"]
    assert two[-3:] == ["-m", "dragon_dagster.engine.worker", "/j.json"]
    on_ray = TrainingResource(launcher="ray", workers=2)
    assert on_ray.command("s3://b/j.json", {**training, "parallel": on_ray.parallel()}) == [
        "python", "-m", "dragon_dagster.engine.worker", "s3://b/j.json"]  # the driver; Ray Train runs the ranks
