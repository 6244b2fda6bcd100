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

from dragon_dagster.engine import catalog
from dragon_dagster.engine.config.hardware import Hardware, SettingsError, Speed, build
from dragon_dagster.engine.config.job import TrainingInputs
from dragon_dagster.engine.config.reporter import Reporter
from dragon_dagster.engine.stages.grpo.settings import GRPO
from dragon_dagster.engine.stages.sft.worker import train_sft
from dragon_dagster.engine.train import lm_head
from tests.support import sft_job as job
from tests.support import small_lora_model, ticket_files

ROOT = Path(__file__).resolve().parents[3]


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


@pytest.mark.parametrize("head_trains", [False, True])
def test_chunked_log_probs_give_autograd_values_stats_and_gradients(head_trains):
    """A frozen head (LoRA) forms the hidden states' gradient in forward; a trainable one recomputes the logits
    in backward for its own gradient. Both give what plain autograd over the full logits gives."""
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(11, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 16, generator=g, dtype=torch.float64, requires_grad=head_trains)
    targets = torch.randint(0, 40, (11,), generator=g)
    upstream, temperature = torch.randn(11, generator=g, dtype=torch.float64), 0.7
    out = lm_head.logprobs(hidden, weight, targets, temperature, chunk=4, stats=lm_head.STATS)
    (out["log_probs"] * upstream).sum().backward()
    ours = hidden.grad.clone(), None if weight.grad is None else weight.grad.clone()
    hidden.grad = weight.grad = None
    log_probs = torch.log_softmax(hidden @ weight.t() / temperature, dim=1)
    expected = log_probs.gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(out["log_probs"].double(), expected, atol=1e-5)
    assert torch.allclose(out["entropy"].double(), -(log_probs.exp() * log_probs).sum(1), atol=1e-5)
    assert torch.allclose(out["mean_logits"].double(), (hidden @ weight.t() / temperature).mean(1), atol=1e-5)
    assert torch.equal(out["is_top1"], targets == log_probs.argmax(1))
    assert torch.allclose(out["log_sum_sq_probs"].double(), torch.logsumexp(2 * log_probs, 1), atol=1e-5)
    (expected * upstream).sum().backward()
    assert torch.allclose(ours[0], hidden.grad, atol=1e-5)  # the logits are float32 inside
    assert (ours[1] is None) == (not head_trains)
    if head_trains:
        assert torch.allclose(ours[1], weight.grad, atol=1e-5)
    with torch.no_grad():  # the reference pass: values only
        assert torch.allclose(
            lm_head.logprobs(hidden, weight, targets, temperature, chunk=4)["log_probs"].double(), expected, atol=1e-5
        )


def progress_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]


def sft_losses(tmp_path, tiny_model, train, held, kernel: str) -> list[float]:
    (tmp_path / kernel).mkdir()
    speed = {"loss_kernel": kernel, "packing": "off"}
    run = job(tmp_path / kernel, tiny_model, train, held, speed, max_steps=4, grad_accum=2, learning_rate=5e-2)
    # no LoRA dropout: the chunked path drops over the unpadded tokens, so its masks differ from the padded run's
    run.settings.lora.dropout = 0.0
    assert train_sft(run, Reporter()).speed["loss_kernel"] == kernel  # the path asked for is the one taken
    return [r["loss"] for r in progress_rows(tmp_path / kernel / "out") if r.get("loss") is not None]


def test_sft_with_the_chunked_head_trains_exactly_like_trl(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path, n=40)
    trl_losses = sft_losses(tmp_path, tiny_model, train, held, "trl")
    chunked_losses = sft_losses(tmp_path, tiny_model, train, held, "chunked")
    assert len(trl_losses) >= 3
    assert chunked_losses == pytest.approx(trl_losses, rel=1e-4)  # same loss, same updates, step after step


def grpo_rows_logged(tmp_path, tiny_model, kernel: str) -> list[dict]:
    from dragon_dagster.engine.data import tables as data
    from dragon_dagster.engine.pipeline.definition import EXAMPLE_DIR
    from dragon_dagster.engine.stages.grpo.worker import train_grpo

    work = tmp_path / kernel
    (work / "out").mkdir(parents=True)
    prompts = data.map_prompts(
        data.read_table(EXAMPLE_DIR / "arithmetic.csv"), data.PromptsMapping(prompt="question", reference="answer")
    )[:16]
    data.write_jsonl(work / "prompts.jsonl", prompts)
    settings = GRPO(
        name="grpo_adapter",
        kind="grpo",
        dataset="prompts",
        args={
            "max_steps": 2,
            "batch_size": 2,
            "grad_accum": 1,
            "logging_steps": 1,
            "save_steps": 100,
            "learning_rate": 5e-2,
            "warmup_ratio": 0.0,
        },
        rewards=[{"type": "length", "max_chars": 24}],
        group_size=8,
        beta=0.04,
        temperature=0.7,
        max_new_tokens=6,
        max_eval_prompts=2,
        n_samples=1,
        lora={"dropout": 0.0},
    )
    run = catalog.get("grpo").job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(work / "prompts.jsonl"), checkpoint_dir=str(work / "ckpt")
        ),
        output_dir=str(work / "out"),
        hardware=Hardware(device="cpu"),
        # one sampling round for both steps: step 2 weighs the same samples against step 1's update
        speed=Speed(loss_kernel=kernel, generation_batch_size=32),
    )
    result = train_grpo(run, Reporter())
    assert result.speed["loss_kernel"] == kernel and result.speed["generation_batch_size"] == 32
    assert result.speed["unpad"] == (kernel == "chunked")
    return [r for r in progress_rows(work / "out") if r.get("grad_norm") is not None]


def test_grpo_with_chunked_log_probs_trains_exactly_like_trl(tiny_model, tmp_path):
    trl_rows = grpo_rows_logged(tmp_path, tiny_model, "trl")
    chunked_rows = grpo_rows_logged(tmp_path, tiny_model, "chunked")
    assert [r["step"] for r in trl_rows] == [1, 2]
    assert trl_rows[0]["reward_std"] > 0 and trl_rows[0]["grad_norm"] > 0  # the rewards disagree: a real gradient
    assert trl_rows[1]["kl"] > 0 and trl_rows[1]["loss"] != 0  # step 2 is off its sampling policy
    assert chunked_rows[0]["reward"] == trl_rows[0]["reward"]  # the same samples
    for key in ("grad_norm", "loss", "kl", "entropy"):
        assert [r.get(key) for r in chunked_rows] == pytest.approx(
            [r.get(key) for r in trl_rows], rel=1e-3, abs=1e-6
        ), key


def test_grpo_generation_batch_must_hold_whole_steps(tiny_model, tmp_path):
    from dragon_dagster.engine.stages.grpo.worker import train_grpo

    settings = GRPO(
        name="grpo_adapter",
        kind="grpo",
        dataset="prompts",
        args={"batch_size": 2},
        group_size=4,
        rewards=[{"type": "length", "max_chars": 5}],
    )
    run = catalog.get("grpo").job_model()(
        settings=settings,
        inputs=TrainingInputs(
            model=str(tiny_model), train_file=str(tmp_path / "none.jsonl"), checkpoint_dir=str(tmp_path / "ckpt")
        ),
        output_dir=str(tmp_path),
        speed=Speed(generation_batch_size=12),
    )
    with pytest.raises(ValueError, match=r"generation_batch_size \(12\) must be a multiple .* = 8"):
        train_grpo(run, Reporter())


def test_sft_packing_trains_and_says_so(tiny_model, tmp_path):
    train, held = ticket_files(tmp_path, n=40)
    run = job(tmp_path, tiny_model, train, held, {"packing": "on"}, max_steps=2)

    class Lines(Reporter):
        def __init__(self):
            super().__init__()
            self.lines = []

        def log(self, message):
            self.lines.append(message)

    reporter = Lines()
    result = train_sft(run, reporter)
    assert result.global_step == 2 and (tmp_path / "out" / "adapter" / "adapter_config.json").exists()
    assert any("packing on" in line for line in reporter.lines)


def test_speed_settings_resolve_per_device_and_name_bad_values():
    assert Speed().resolve("cuda") == Speed(
        packing="on", loss_kernel="trl", unpad="off", dropout_mask="torch", lora_product="peft", sampling="grouped"
    )
    assert Speed().resolve("cpu") == Speed(
        packing="off",
        loss_kernel="chunked",
        unpad="on",
        dropout_mask="fast",
        lora_product="accumulated",
        sampling="grouped",
    )
    assert Speed(packing="off", loss_kernel="chunked").resolve("cuda").packing == "off"  # overrides win
    with pytest.raises(SettingsError, match="speed.packing"):
        build(Speed, {"packing": "yes"}, "speed")
    with pytest.raises(SettingsError, match="speed.unpad"):
        build(Speed, {"unpad": True}, "speed")
    with pytest.raises(SettingsError, match="speed.dropout_mask"):
        build(Speed, {"dropout_mask": "quick"}, "speed")
    with pytest.raises(SettingsError, match="speed.generation_batch_size"):
        build(Speed, {"generation_batch_size": 0}, "speed")
    with pytest.raises(SettingsError, match="unknown setting"):
        build(Speed, {"pack": "on"}, "speed")


def test_training_resource_sends_speed_to_trainer_jobs_only(tmp_path, monkeypatch):
    from dagster import Failure, build_asset_context

    from dragon_dagster.engine.config.job import ModelInputs
    from dragon_dagster.engine.stages.merge.settings import Merge
    from dragon_dagster.engine.stages.merge.worker import MergeJob
    from dragon_dagster.resources import TrainingResource, training

    resource = TrainingResource(device="cpu", loss_kernel="trl", generation_batch_size=64, python=sys.executable)
    assert resource.speed().model_dump() == {
        "packing": "auto",
        "loss_kernel": "trl",
        "generation_batch_size": 64,
        "torch_compile": False,
        "unpad": "auto",
        "dropout_mask": "auto",
        "lora_product": "auto",
        "sampling": "auto",
    }
    missing = tmp_path / "no-model"  # the jobs name no model that exists: the worker fails, the job file stays
    launched = []

    class FailingWorker:  # a directly built asset context cannot open a Pipes session: the launch is stood in for
        def launch(self, context, resource, command, env, tap, parallel):
            launched.append(command[-1])
            return 1  # what the worker exits with when it cannot load the model

    monkeypatch.setitem(training.LAUNCHERS, "subprocess", FailingWorker)
    for kind in ("sft", "merge"):
        (tmp_path / kind).mkdir()
    jobs = {
        "sft": job(tmp_path / "sft", missing, missing / "train.jsonl", missing / "eval.jsonl"),
        "merge": MergeJob(
            settings=Merge(name="merged_model", kind="merge"),
            inputs=ModelInputs(model=str(missing)),
            output_dir=str(tmp_path / "merge"),
        ),
    }
    seen = {}
    for kind, typed in jobs.items():
        with pytest.raises(Failure, match=rf"the {kind} worker \(subprocess\) exited with code 1"):
            resource.run_job(build_asset_context(), typed, tmp_path / kind)
        seen[kind] = json.loads((tmp_path / kind / "job.json").read_text())
    assert seen["sft"]["speed"]["loss_kernel"] == "trl" and seen["merge"].get("speed") is None
    assert [Path(f).parent.name for f in launched] == ["sft", "merge"]  # each worker was given its own run file


@pytest.mark.slow
def test_benchmark_runs_the_peer_and_ours_on_the_same_rows_in_interleaved_rounds(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare_trl.py"),
            "--only",
            "sft,grpo",
            "--rounds",
            "2",
            "--steps",
            "4",
            "--grpo-steps",
            "3",
            "--skip",
            "1",
            "--grpo-skip",
            "1",
            "--comp",
            "8",
            "--json",
            str(tmp_path / "bench.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    # two rounds, each side once per measurement per round, the side that goes first alternating
    assert [(r["measurement"], r["side"]) for r in runs] == [
        ("sft", "peer"), ("sft", "ours"), ("grpo", "peer"), ("grpo", "ours"),
        ("sft", "ours"), ("sft", "peer"), ("grpo", "ours"), ("grpo", "peer"),
    ]  # fmt: skip
    for run in runs:
        assert run["figure"] > 0 and run["peak_gib"] > 0
    # the same rows, model and objective on both sides: the first step's loss is the same number
    for measurement in ("sft", "grpo"):
        first = {r["side"]: r["losses"][0] for r in runs if r["measurement"] == measurement and r["tag"].endswith("-0")}
        assert first["peer"] == pytest.approx(first["ours"], rel=1e-4, abs=1e-6)
    assert "| sft: trained tokens/s |" in out.stdout and "x** | 2 |" in out.stdout


def _custom(payload) -> dict:
    return {"__dagster_pipes_version": "0.1", "method": "report_custom_message", "params": {"payload": payload}}


def test_pipes_tap_takes_metrics_and_outcome_and_passes_the_rest_on():
    from dragon_dagster.resources.launchers.base import PipesTap, _TappedHandler

    seen, passed = [], []

    class Handler:
        def handle_message(self, message):
            passed.append(message)

    tap = PipesTap(lambda step, values: seen.append((step, values)))
    handler = _TappedHandler(Handler(), tap)
    log = {"__dagster_pipes_version": "0.1", "method": "log", "params": {"message": "hi", "level": "INFO"}}
    for message in (
        _custom({"kind": "metrics", "step": 1, "values": {"train/loss": 2.5}}),
        log,
        _custom({"note": "not ours"}),
        _custom({"kind": "outcome", "event": "result", "result": {"steps": 3}}),
    ):
        handler.handle_message(message)
    assert seen == [(1, {"train/loss": 2.5})]
    assert tap.outcome == {"event": "result", "result": {"steps": 3}}
    assert passed == [log, _custom({"note": "not ours"})]  # Dagster still gets its own and the user's


def test_pipes_tap_skips_metrics_it_cannot_log_and_keeps_going():
    from dragon_dagster.resources.launchers.base import PipesTap

    seen, warnings = [], []

    def log(step, values):
        if step == 2:
            raise ConnectionError("tracking server unreachable")
        seen.append(step)

    tap = PipesTap(log, warn=warnings.append)
    for message in (
        _custom({"kind": "metrics", "step": 1, "values": {}}),
        _custom({"kind": "metrics", "step": "not a step", "values": {}}),
        _custom({"kind": "metrics", "step": 2, "values": {}}),
        _custom({"kind": "metrics", "step": 3, "values": {}}),
    ):
        assert tap.take(message)
    assert seen == [1, 3] and tap.failures == 2
    assert len(warnings) == 1 and "could not forward" in warnings[0]  # said once, not per line


def test_the_worker_command_per_launcher_and_workers(tmp_path):
    from dragon_dagster.resources import TrainingResource

    training = job(tmp_path, "model", tmp_path / "train.jsonl", tmp_path / "eval.jsonl")
    one = TrainingResource().command("/runs/x/.job-run.json", training)
    assert one == [sys.executable, "-m", "dragon_dagster.engine.runtime.worker", "/runs/x/.job-run.json"]
    resource = TrainingResource(workers=2, termination_timeout_s=300)
    two = resource.command("/j.json", training.model_copy(update={"parallel": resource.parallel()}))
    # torchrun stops its ranks before the resource kills the agent's group, which does not hold them
    assert two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--shutdown-timeout=290"]
    assert two[-3:] == ["-m", "dragon_dagster.engine.runtime.worker", "/j.json"]
    on_ray = TrainingResource(launcher="ray", workers=2)
    assert on_ray.command("s3://b/j.json", training.model_copy(update={"parallel": on_ray.parallel()})) == [
        "python",
        "-m",
        "dragon_dagster.engine.runtime.worker",
        "s3://b/j.json",
    ]  # the driver; Ray Train runs the ranks


# ------------------------------------------------------------------ unpadded forward, preference heads, dropout


def ragged_batch(vocab=300, rows=4, length=12, seed=3):
    """Token ids and a mask padded every way a trainer pads: left (a prompt), right (an early end), both."""
    ids = torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, -2:] = 0
    mask[3, :2] = 0
    mask[3, -1] = 0
    return ids, mask


def test_unpadded_forward_gives_the_padded_log_probs_and_gradients():
    from dragon_dagster.engine.train import unpadded

    model = small_lora_model()
    ids, mask = ragged_batch()
    n, weights = 6, torch.randn(4, 6)
    logps, entropy = lm_head.completion_logprobs(model, ids, mask, n, 0.7, chunk=4)
    (logps * weights).sum().backward()
    expected = lora_grads(model)
    with pytest.raises(RuntimeError, match="unpadded.use"):  # plain SDPA would let the rows attend to each other
        lm_head.completion_logprobs(model, ids, mask, n, 0.7, unpad=True)
    unpadded.use(model)
    fast, fast_entropy = lm_head.completion_logprobs(model, ids, mask, n, 0.7, chunk=4, unpad=True)
    assert torch.allclose(fast, logps, atol=1e-5) and torch.allclose(fast_entropy, entropy, atol=1e-4)
    assert (fast[2, -2:] == 0).all() and (fast[3, -1] == 0)  # padding after a completion scores zero
    (fast * weights).sum().backward()
    assert_same_grads(lora_grads(model), expected)
    # the padded path (generation, evaluation) goes on through transformers' SDPA and its mask
    again, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.7)
    assert torch.allclose(again, logps, atol=1e-6)


def test_unpadded_sft_loss_equals_the_padded_loss_and_generation_is_unchanged():
    from dragon_dagster.engine.train import unpadded

    model = small_lora_model()
    padded = collate(examples(), padding_free=False)
    prompt = torch.tensor([[5, 6, 7, 8]])
    before = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False)
    plain, counts = lm_head.causal_lm_loss(model, padded, padded["labels"])
    plain.backward()
    expected = lora_grads(model)
    unpadded.use(model)
    fast, fast_counts = lm_head.causal_lm_loss(model, padded, padded["labels"], unpad=True)
    assert fast.item() == pytest.approx(plain.item(), rel=1e-5) and fast_counts == counts
    fast.backward()
    assert_same_grads(lora_grads(model), expected)
    after = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False)
    assert torch.equal(before, after)


@pytest.mark.parametrize("unpad", [False, True])
def test_chunked_preference_head_gives_trl_fused_head_values_and_gradients(unpad):
    """What DPO and KTO read from TRL's fused head (add_fused_lm_head), from the chunked one."""
    from trl.trainer.utils import add_fused_lm_head

    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import use_chunked_head

    model = small_lora_model()
    ids, mask = ragged_batch()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :6] = -100  # the prompt is not scored
    fields = ("log_probs", "entropy", "mean_logits", "is_top1", "log_sum_sq_probs")
    add_fused_lm_head(model.get_base_model(), outputs=fields)
    weights = torch.randn(4, 11)

    def run():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        ((out.log_probs * weights).sum() + out.loss).backward()
        return out, lora_grads(model)

    expected, expected_grads = run()
    if unpad:
        unpadded.use(model)
    use_chunked_head(model.get_base_model(), unpad=unpad, weighting=True)
    ours, grads = run()
    for field in fields:
        assert torch.allclose(getattr(ours, field).float(), getattr(expected, field).float(), atol=1e-4), field
    assert torch.equal(ours.label_mask, expected.label_mask)
    assert ours.loss.item() == pytest.approx(expected.loss.item(), rel=1e-5)
    assert_same_grads(grads, expected_grads)
    # generation goes through TRL's forward, unchanged
    assert model.generate(ids[:1, :4], max_new_tokens=3, do_sample=False).shape == (1, 7)


def test_chunked_orpo_forward_gives_trl_values_and_gradients():
    from types import SimpleNamespace

    from trl.experimental.orpo import ORPOTrainer

    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import orpo_forward

    model = small_lora_model()
    ids, mask = ragged_batch(rows=4, length=10)
    ids, mask = ids[[0, 2, 1, 3]], mask[[0, 2, 1, 3]]  # right padding only, as ORPO's collator pads
    mask[2:] = 1
    mask[2, -3:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :4] = -100
    batch = {
        "chosen_input_ids": ids[:2],
        "chosen_attention_mask": mask[:2],
        "chosen_labels": labels[:2],
        "rejected_input_ids": ids[2:],
        "rejected_attention_mask": mask[2:],
        "rejected_labels": labels[2:],
    }
    trainer = SimpleNamespace(
        concatenated_inputs=ORPOTrainer.concatenated_inputs,
        is_encoder_decoder=False,
        get_batch_logps=ORPOTrainer.get_batch_logps,
        padding_value=0,
        aux_loss_enabled=False,
        accelerator=SimpleNamespace(device=torch.device("cpu")),
    )

    def loss(out):  # every output that carries a gradient, weighted apart
        return out[0].sum() * 0.3 - out[1].sum() * 0.7 + out[4]

    expected = ORPOTrainer.concatenated_forward(trainer, model, batch)
    loss(expected).backward()
    expected_grads = lora_grads(model)
    unpadded.use(model)
    concatenated = ORPOTrainer.concatenated_inputs(batch)
    for unpad in (False, True):
        ours = orpo_forward(model, concatenated, 2, unpad)
        for i in (0, 1, 4):
            assert torch.allclose(ours[i], expected[i], atol=1e-5), i
        # logits/* metrics: the mean logit over the scored positions, not over every position
        assert ours[2].shape[0] == int(mask[:2, 1:].sum()) and ours[2].mean().abs() < 1
        loss(ours).backward()
        assert_same_grads(lora_grads(model), expected_grads)


def test_fast_dropout_drops_at_the_rate_asked_keeps_the_expectation_and_swaps_into_lora():
    from dragon_dagster.engine.train.dropout import FastDropout, keep_mask, use_fast_dropout

    torch.manual_seed(0)
    keep, scale = keep_mask((1000, 1000), 0.05)
    assert keep.float().mean().item() == pytest.approx(0.95, abs=0.001)  # 1e6 draws: sd 0.0002
    assert scale == pytest.approx(1 / 0.95, rel=1e-4)
    lanes = keep.view(-1, 4).float().mean(dim=0)  # each 16-bit quarter of a 64-bit draw drops alike
    assert torch.allclose(lanes, torch.full((4,), 0.95), atol=0.002)
    x = torch.ones(500, 1000, requires_grad=True)
    dropout = FastDropout(0.1).train()
    y = dropout(x)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)
    assert y.unique().tolist() == [0.0, pytest.approx(1 / 0.9, rel=1e-4)]
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # backward scales by the same mask
    assert torch.equal(dropout.eval()(x), x)
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules="all-linear", lora_dropout=0.05))
    assert use_fast_dropout(model) == 14  # seven adapted projections per layer
    assert sum(isinstance(m, FastDropout) and m.p == 0.05 for m in model.modules()) == 14


def dpo_batch(vocab=300, seed=5):
    """DPO's [chosen; rejected] rows, right-padded: pairs 0 and 1 share their prompt, pair 2's prompts differ."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g) for n in (5, 3, 4)]
    other = torch.randint(0, vocab, (4,), generator=g)
    replies = [torch.randint(0, vocab, (n,), generator=g) for n in (4, 6, 3, 2, 5, 3)]
    rows = [torch.cat([prompts[i], replies[i]]) for i in range(3)]
    rows += [torch.cat([prompts[0], replies[3]]), torch.cat([prompts[1], replies[4]]), torch.cat([other, replies[5]])]
    starts = [5, 3, 4, 5, 3, 4]
    length = max(len(r) for r in rows)
    ids = torch.zeros(6, length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
        labels[i, starts[i] : len(row)] = row[starts[i] :]
    return ids, mask, labels


def test_dpo_pairs_run_their_common_prompt_once_and_give_trl_values_and_gradients():
    from trl.trainer.utils import add_fused_lm_head

    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import use_chunked_head

    model = small_lora_model()
    ids, mask, labels = dpo_batch()
    starts = (labels[:, 1:] != -100).int().argmax(dim=1) + 1
    flat = unpadded.layout(ids, mask, reply_starts=starts)
    assert len(flat.tokens) == int(mask.sum()) - 5 - 3  # pairs 0 and 1 lay their prompt down once, pair 2 twice
    assert flat.prefixes.count(None) == 4 and flat.prefixes[3] == (0, 5)  # rejected reply 0 attends to prompt 0
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1)

    def run():
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (out.log_probs * weights).sum().backward()
        return out, lora_grads(model)

    expected, expected_grads = run()
    unpadded.use(model)
    use_chunked_head(model.get_base_model(), unpad=True, paired=True)
    ours, grads = run()
    for field in ("log_probs", "entropy", "mean_logits", "is_top1"):
        assert torch.allclose(getattr(ours, field).float(), getattr(expected, field).float(), atol=1e-4), field
    assert_same_grads(grads, expected_grads)


def test_a_grpo_group_runs_its_prompt_once_and_scores_as_the_padded_batch():
    from dragon_dagster.engine.train import unpadded

    model = small_lora_model()
    g = torch.Generator().manual_seed(7)
    n = 5
    prompts = [torch.randint(0, 300, (k,), generator=g) for k in (6, 4)]  # two prompts, three completions each
    ids = torch.zeros(6, 6 + n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(6):
        prompt = prompts[row // 3]
        ids[row, 6 - len(prompt) : 6] = prompt  # left-padded to one width, as TRL pads prompts
        ids[row, 6:] = torch.randint(0, 300, (n,), generator=g)
        mask[row, 6 - len(prompt) :] = 1
    mask[4, -2:] = 0  # a completion that ended early
    replies = torch.zeros(6, ids.shape[1] - 1, dtype=torch.bool)
    replies[:, -n:] = True
    flat = unpadded.layout(ids, mask, reply_starts=replies.int().argmax(dim=1) + 1)
    assert len(flat.tokens) == int(mask.sum()) - 2 * 6 - 2 * 4  # each prompt once, not three times
    weights = torch.randn(6, n)
    logps, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.9)
    (logps * weights).sum().backward()
    expected = lora_grads(model)
    unpadded.use(model)
    fast, _ = lm_head.completion_logprobs(model, ids, mask, n, 0.9, unpad=True)
    assert torch.allclose(fast, logps, atol=1e-5)
    (fast * weights).sum().backward()
    assert_same_grads(lora_grads(model), expected)


@pytest.mark.parametrize("loop", ["ours", "generate's"])
def test_grouped_sampling_prefills_each_prompt_once_and_decodes_the_same_tokens(loop, monkeypatch):
    from dragon_dagster.engine.infer import decode_loop
    from dragon_dagster.engine.train import rollout

    if loop != "ours":  # a model the decoding loop does not run: generate's loop on a cache prefilled by rollout
        monkeypatch.setattr(decode_loop, "unsupported_model", lambda model: "switched off by the test")
    model = small_lora_model()
    prompts = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])  # one left-padded
    ids = prompts.repeat_interleave(3, dim=0)  # each prompt three times, as TRL's rows repeat it
    mask = (ids != 0).long()
    assert rollout.groups_of(ids, mask) == 3
    assert rollout.groups_of(ids[[0, 3, 1, 4, 2, 5]], mask[[0, 3, 1, 4, 2, 5]]) == 1  # interleaved: no groups
    assert rollout.groups_of(ids[:4], mask[:4]) == 1  # a group cut short
    model.eval()
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    model.train()
    calls = []  # (the tokens a forward pass embeds, train mode): once a forward in either loop
    embeddings = model.get_base_model().model.embed_tokens
    handle = embeddings.register_forward_pre_hook(lambda module, args: calls.append((args[0].shape, model.training)))
    with rollout.sampling(model):
        grouped = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    handle.remove()
    assert torch.equal(grouped, plain)  # same tokens (greedy)
    # the prefill: one row per prompt (generate's loop: all but its last token, which its first step runs)
    assert calls[0][0] == ((2, 5) if loop == "ours" else (2, 4))
    assert all(shape[0] == 6 for shape, _ in calls[1:])  # then every row decodes
    assert not any(training for _, training in calls)  # sampled in eval mode: no LoRA dropout
    assert model.training and "generate" not in model.__dict__  # train mode and the method are restored


def test_inverse_cdf_sampling_draws_the_same_distribution_as_multinomial():
    from dragon_dagster.engine.train import rollout

    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 0.0, 1.0]]) * 3  # unnormalized, as multinomial accepts
    draws = rollout.inverse_cdf(probs.repeat(50_000, 1), num_samples=1)
    assert draws.shape == (100_000, 1)
    first = torch.bincount(draws[0::2, 0], minlength=4).float() / 50_000
    assert torch.allclose(first, torch.tensor([0.5, 0.0, 0.3, 0.2]), atol=0.01)  # sd about 0.002
    assert first[1] == 0 and (draws[1::2] == 3).all()  # a word of probability 0 is never drawn
    assert rollout.inverse_cdf(probs, num_samples=2).shape == (2, 2)  # other uses go to torch.multinomial
    model = small_lora_model()
    ids = torch.tensor([[5, 6, 7]])
    with rollout.sampling(model):
        model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=True, pad_token_id=0
        )
    assert torch.multinomial is rollout._multinomial  # restored after sampling


def test_inverse_cdf_sums_in_float32_where_the_device_has_no_float64():
    """MPS has no float64: the running sum is float32 there, and still draws the distribution asked for."""
    from dragon_dagster.engine.train import rollout

    assert rollout.running_dtype("mps") == torch.float32
    assert rollout.running_dtype("cpu") == rollout.running_dtype("cuda") == torch.float64
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2]]) * 3
    record = []
    draws = rollout.inverse_cdf(probs.repeat(50_000, 1), num_samples=1, record=record, dtype=torch.float32)
    shares = torch.bincount(draws[:, 0], minlength=4).float() / 50_000
    assert torch.allclose(shares, torch.tensor([0.5, 0.0, 0.3, 0.2]), atol=0.01) and shares[1] == 0
    assert record[0].dtype == torch.float32
    assert torch.allclose(record[0], torch.tensor([0.5, 0.0, 0.3, 0.2]).log()[draws[:, 0]])


def test_sampling_records_the_log_probabilities_a_forward_pass_gives():
    """What a round serving several GRPO steps keeps as the old policy's log-probabilities."""
    from dragon_dagster.engine.train import rollout

    model = small_lora_model()
    ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]]).repeat_interleave(2, dim=0)
    mask = (ids != 0).long()
    record = []
    torch.manual_seed(0)
    with rollout.sampling(model, record):
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=True,
            temperature=0.7,
            top_k=0,
            pad_token_id=0,
            eos_token_id=None,
        )
    recorded = torch.stack(record, dim=1)
    assert recorded.shape == (4, 6) and (recorded < 0).all()
    model.eval()
    with torch.no_grad():
        logps, _ = lm_head.completion_logprobs(
            model, out, torch.cat([mask, torch.ones(4, 6, dtype=torch.long)], 1), 6, 0.7
        )
    assert torch.allclose(recorded, logps, atol=1e-4)


def test_a_round_serving_two_steps_takes_the_old_policy_from_sampling_not_another_pass(
    tiny_model, tmp_path, monkeypatch
):
    calls = []
    scored = lm_head.completion_logprobs

    def counted(model, input_ids, *args, **kwargs):
        calls.append((input_ids.shape[0], torch.is_grad_enabled()))
        return scored(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(lm_head, "completion_logprobs", counted)
    rows = grpo_rows_logged(tmp_path, tiny_model, "chunked")  # 2 steps from one round of 32 completions, beta 0.04
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["kl"] > 0
    without_grad = [n for n, grad in calls if not grad]
    # the reference pass over the round's 32 completions (in chunks of a step's 16), and no old-policy pass
    assert sum(without_grad) == 32 and sum(n for n, grad in calls if grad) == 32


@pytest.mark.parametrize("pack", [True, False])
def test_decoding_on_cpu_folds_the_adapters_packs_the_weights_and_puts_everything_back(pack, monkeypatch):
    from dragon_dagster.engine.infer import decode_weights
    from dragon_dagster.engine.train import rollout

    if not pack:  # a torch without oneDNN: the folded weights stand in for W themselves
        monkeypatch.setattr(decode_weights, "packable", lambda rows: False)
    else:
        assert decode_weights.packable(6)  # this project's CPU build of torch has oneDNN
    model = small_lora_model()
    model.eval()
    ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])
    mask = (ids != 0).long()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        unfolded = model(input_ids=ids, attention_mask=mask).logits
        with model.disable_adapter():
            base = model(input_ids=ids, attention_mask=mask).logits
        layers = decode_weights.foldable(model)
        assert len(layers) == 2 * 7  # every adapted linear layer of the two decoder layers
        linears = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in m.__dict__]
        with decode_weights.prepared(model, rows=2):
            assert all(layer.merged for layer in layers)
            packed = [m for m in linears if "forward" in m.__dict__]
            assert len(packed) == (2 * 7 + 1 if pack else 0)  # the base layers and the output head
            calls = []
            handle = layers[0].lora_A["default"].register_forward_hook(lambda *a: calls.append(1))
            folded = model(input_ids=ids, attention_mask=mask).logits
            handle.remove()
        assert not calls  # the adapter's own products did not run
        assert torch.allclose(folded, unfolded, atol=1e-5) and not torch.allclose(folded, base, atol=1e-3)
        assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())  # bit for bit
        assert not any(layer.merged for layer in layers) and not any("forward" in m.__dict__ for m in linears)
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, unfolded)
        plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        with rollout.sampling(model):
            sampled = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0
            )
    assert torch.equal(sampled, plain)
    with model.disable_adapter():  # adapters off (TRL's reference pass): nothing to fold
        assert decode_weights.foldable(model) == []


def test_decode_weights_run_q_k_v_and_gate_up_as_one_product_each_with_the_same_outputs(monkeypatch):
    from dragon_dagster.engine.infer import decode_weights

    assert decode_weights.packable(2)
    model = small_lora_model()
    model.eval()
    ids = torch.tensor([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]])
    mask = (ids != 0).long()
    products = []
    real = decode_weights.packed_linear

    def counted(packed, bias, x):
        products.append(x.shape)
        return real(packed, bias, x)

    monkeypatch.setattr(decode_weights, "packed_linear", counted)
    with torch.no_grad():
        unfolded = model(input_ids=ids, attention_mask=mask).logits
        attention = model.base_model.model.model.layers[0].self_attn
        x = torch.randn(3, 32)
        expected = [getattr(attention, name)(x) for name in ("q_proj", "k_proj", "v_proj")]
        with decode_weights.prepared(model, rows=2):
            products.clear()
            folded = model(input_ids=ids, attention_mask=mask).logits
            assert len(products) == 2 * 4 + 1  # per layer: q/k/v, o, gate/up, down; then the head
            products.clear()
            assert torch.allclose(attention.k_proj(x), expected[1], atol=1e-5)  # an input q_proj has not seen
            assert torch.allclose(attention.q_proj(x), expected[0], atol=1e-5)
            assert torch.allclose(attention.v_proj(x), expected[2], atol=1e-5)
            assert len(products) == 1  # k's call ran the product and kept q's and v's parts for their calls
        assert torch.allclose(folded, unfolded, atol=1e-5)
        with model.disable_adapter():  # nothing folded: the stacked weights are the layers' own
            base = model(input_ids=ids, attention_mask=mask).logits
            with decode_weights.prepared(model, rows=2):
                assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, base, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in model.modules())  # all put back


def test_adapters_that_a_folded_model_would_not_run_stay_as_they_are():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from dragon_dagster.engine.infer import decode_weights

    config = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    for lora in (
        LoraConfig(r=4, target_modules="all-linear", use_dora=True),
        LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]),
    ):
        torch.manual_seed(0)
        model = get_peft_model(LlamaForCausalLM(config), lora).eval()
        for name, param in model.named_parameters():  # LoRA B starts at zero; make the adapter matter
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.1)
        ids = torch.tensor([[5, 6, 7, 8]])
        assert decode_weights.foldable(model) == []
        with torch.no_grad():
            expected = model(input_ids=ids).logits
            with decode_weights.prepared(model, rows=1):  # unfolded, the linear layers still packed
                assert not any(getattr(m, "merged", False) for m in model.modules())
                assert torch.allclose(model(input_ids=ids).logits, expected, atol=1e-5)


def kto_batch(vocab=300, seed=9):
    """TRL's KTO batch of four rated replies (rows 0 and 2 answer one prompt, as unpaired pairs do) and the
    mismatched rows its KL term pairs them with (each prompt with the previous row's reply), as its collator pads."""
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (5, 3, 5, 4)]
    prompts[2] = prompts[0]
    replies = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (4, 1, 6, 3)]
    rows = [
        {"prompt_ids": p, "completion_ids": r, "KL_completion_ids": replies[i - 1], "label": i % 2 == 0}
        for i, (p, r) in enumerate(zip(prompts, replies))
    ]
    return DataCollatorForUnpairedPreference(pad_token_id=0)(rows), prompts, replies


def test_kto_mismatched_replies_continue_the_rated_prompts_and_the_reference_runs_once(monkeypatch):
    from types import SimpleNamespace

    from trl.trainer.utils import add_fused_lm_head

    from dragon_dagster.engine.stages.kto.trainer import same_prompts, shared_prompt_trainer
    from dragon_dagster.engine.train import unpadded
    from dragon_dagster.engine.train.preference_head import Continuations, use_chunked_head

    model = small_lora_model()
    batch, prompts, replies = kto_batch()
    assert same_prompts(batch)
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    kl_labels = batch["KL_input_ids"].masked_fill(batch["KL_completion_mask"] == 0, -100)
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    weights = torch.randn(labels.shape[0], labels.shape[1] - 1)

    def trl_pass(ids, mask, scored):
        return model(input_ids=ids, attention_mask=mask, labels=scored, fused_lm_head=True).log_probs.sum(-1)

    with torch.no_grad():  # TRL's four passes: policy and reference, over the mismatched and the rated rows
        kl = trl_pass(batch["KL_input_ids"], batch["KL_attention_mask"], kl_labels)
        with model.disable_adapter():
            ref = trl_pass(batch["input_ids"], batch["attention_mask"], labels)
            ref_kl = trl_pass(batch["KL_input_ids"], batch["KL_attention_mask"], kl_labels)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels, fused_lm_head=True)
    (out.log_probs * weights).sum().backward()
    expected_grads = lora_grads(model)

    unpadded.use(model)
    use_chunked_head(model.get_base_model(), unpad=True, paired=True)
    ran = []  # tokens of each padding-free pass
    flat = unpadded.flat_hidden_states
    monkeypatch.setattr(
        unpadded, "flat_hidden_states", lambda b, tokens, *a, **k: ran.append(len(tokens)) or flat(b, tokens, *a, **k)
    )
    rows = Continuations(batch["KL_input_ids"], batch["KL_attention_mask"], batch["KL_completion_mask"], torch.zeros(4))
    ours = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=labels,
        fused_lm_head=True,
        continuations=rows,
    )
    assert torch.allclose(rows.logps, kl, atol=1e-4) and not rows.logps.requires_grad
    assert torch.allclose(ours.log_probs, out.log_probs, atol=1e-5)
    (ours.log_probs * weights).sum().backward()
    assert_same_grads(lora_grads(model), expected_grads)
    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m), model=model)
    ours_ref, ours_ref_kl = shared_prompt_trainer()._reference_logps(trainer, batch)
    assert torch.allclose(ours_ref, ref, atol=1e-4) and torch.allclose(ours_ref_kl, ref_kl, atol=1e-4)
    # the rated pass lays prompt 0 down once for rows 0 and 2; the mismatched replies run without their prompts
    # or their last token; the reference runs each distinct prompt once for all four rows and both replies
    tokens = sum(map(len, prompts)) + sum(map(len, replies))
    assert ran == [tokens - 5, sum(len(r) - 1 for r in replies), tokens - 5 + sum(map(len, replies))]


def test_lora_layers_accumulate_their_product_into_the_base_output_with_peft_values_and_gradients():
    from torch.profiler import profile

    from dragon_dagster.engine.train.dropout import use_fast_dropout
    from dragon_dagster.engine.train.lora_products import use_lora_products

    model = small_lora_model(kind="qwen2", dropout=0.1)  # q/k/v with biases, LoRA dropout drawn in the adapters
    use_fast_dropout(model)
    ids = torch.randint(0, 300, (3, 7), generator=torch.Generator().manual_seed(2))

    def run():
        torch.manual_seed(3)  # the same dropout masks on both paths
        logits = model(input_ids=ids).logits
        (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
        return logits.detach(), lora_grads(model)

    peft_logits, peft_grads = run()
    with torch.no_grad(), model.disable_adapter():
        base_logits = model(input_ids=ids).logits
    assert use_lora_products(model) == 14  # seven adapted projections per layer
    with profile() as prof:
        logits, grads = run()
    ops = {e.key: e.count for e in prof.key_averages()}
    assert ops.get("aten::addmm_") == 14  # each adapter's product accumulated into its layer's output
    assert torch.allclose(logits, peft_logits, atol=1e-5)
    assert_same_grads(grads, peft_grads)
    with torch.no_grad(), model.disable_adapter():  # adapters off: the base layers alone, as PEFT runs them
        assert torch.equal(model(input_ids=ids).logits, base_logits)
    assert use_lora_products(model) == 0  # once per layer
