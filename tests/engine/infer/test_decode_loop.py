"""The decoding loop (engine/infer/decode_loop.py) against transformers' generate: the same greedy tokens, the same
sampled distribution, generate's own loop where ours does not apply."""

from __future__ import annotations

import logging

import pytest
import torch
from scipy.stats import chisquare

from dragon_dagster.engine.infer import decode_loop, decode_weights
from tests.support import SMALL_DECODER, small_lora_model


def small_model(kind: str = "llama", vocab: int = 300):
    """A random two-layer Llama or Qwen2 under a LoRA that counts, in eval mode (as the loop decodes)."""
    return small_lora_model(vocab=vocab, kind=kind).eval()


def ragged_prompts(vocab: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """Four prompts of different lengths, left-padded with 0, two of them repeated (a GRPO-like group) and two not."""
    ids = (
        torch.tensor([[0, 0, 0, 11, 12, 13], [0, 0, 0, 11, 12, 13], [21, 22, 23, 24, 25, 26], [0, 31, 32, 33, 34, 35]])
        % vocab
    )
    return ids, (ids != 0).long()


class Scores:
    """A logits processor that keeps what it is given (the same place in both loops) and changes nothing."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.append(scores.clone())
        return scores


def greedy(model, ids, mask, ours: bool, **kwargs) -> tuple[torch.Tensor, list]:
    from transformers import LogitsProcessorList

    scores = Scores()
    extra = {"custom_generate": decode_loop.decode} if ours else {}
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        pad_token_id=0,
        logits_processor=LogitsProcessorList([scores]),
        **extra,
        **kwargs,
    )
    return out, scores.seen


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("prepared", [False, True])
def test_greedy_tokens_and_logits_equal_generates(kind, prepared):
    model = small_model(kind)
    ids, mask = ragged_prompts()
    with decode_weights.prepared(model, ids.shape[0]) if prepared else torch.no_grad():
        theirs, their_scores = greedy(model, ids, mask, ours=False, max_new_tokens=16)
        ours, our_scores = greedy(model, ids, mask, ours=True, max_new_tokens=16)
    assert torch.equal(ours, theirs)
    assert len(our_scores) == len(their_scores) == 16
    for a, b in zip(our_scores, their_scores, strict=True):
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_finished_rows_are_padded_and_the_call_ends_when_every_row_has():
    model = small_model()
    ids, mask = ragged_prompts()
    theirs, _ = greedy(model, ids, mask, ours=False, max_new_tokens=12)
    stop = int(theirs[2, ids.shape[1] + 2])  # the third token row 2 decodes: an end token for this call
    theirs, _ = greedy(model, ids, mask, ours=False, max_new_tokens=12, eos_token_id=stop)
    ours, _ = greedy(model, ids, mask, ours=True, max_new_tokens=12, eos_token_id=stop)
    assert torch.equal(ours, theirs)
    assert (ours[2, ids.shape[1] + 3 :] == 0).all()  # padded after its end token


def test_greedy_tokens_equal_generates_on_the_tiny_and_the_embedded_model(tiny_model, embedded_dir):
    from dragon_dagster.engine import models
    from dragon_dagster.engine.config.hardware import Hardware
    from dragon_dagster.engine.infer.generation import generate_batch

    prompts = [
        [{"role": "user", "content": "What is 17 + 25? Reply with just the number."}],
        [{"role": "user", "content": "Write one sentence about a dragon who farms."}],
    ]
    for directory in (tiny_model, embedded_dir):
        model = models.load_model(str(directory), Hardware(device="cpu"))
        tokenizer = models.load_tokenizer(str(directory))
        model.eval()
        tokenizer.padding_side = "left"
        texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with decode_weights.prepared(model, len(prompts)):
            settings = dict(max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            theirs = model.generate(**batch, **settings)
            ours = model.generate(**batch, **settings, custom_generate=decode_loop.decode)
        assert torch.equal(ours, theirs), directory
        # and the project's replies (evaluation, reports, preference pairs) come from the loop, the same text
        replies = generate_batch(model, tokenizer, prompts, torch.device("cpu"), 24, 0.0, 1.0)
        expected = tokenizer.batch_decode(theirs[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        assert replies == [t.strip() for t in expected]


def pair_shares(samples: torch.Tensor) -> dict[tuple[int, int], int]:
    pairs, counts = samples.unique(dim=0, return_counts=True)
    return {tuple(p.tolist()): int(c) for p, c in zip(pairs, counts, strict=True)}


def exact_pair_probabilities(model, prompt: torch.Tensor, temperature: float, top_p: float) -> dict:
    """P(first, second) of two sampled tokens, from the model's own forward passes and transformers' warpers."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    warp = LogitsProcessorList(
        [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
    )
    with torch.no_grad():
        first = warp(prompt, model(prompt).logits[:, -1].float()).softmax(-1)[0]
        words = first.nonzero().squeeze(1)
        rows = torch.cat([prompt.repeat(len(words), 1), words[:, None]], dim=1)
        second = warp(rows, model(rows).logits[:, -1].float()).softmax(-1)
    return {
        (int(w), int(v)): float(first[w] * second[i, v]) for i, w in enumerate(words) for v in second[i].nonzero()[:, 0]
    }


def goodness_of_fit(samples: torch.Tensor, expected: dict) -> float:
    """Chi-square p-value of the sampled pairs against their probabilities, rare pairs pooled (expected count >= 5);
    0 when a pair of probability 0 was sampled."""
    n = samples.shape[0]
    seen = pair_shares(samples)
    if not set(seen) <= set(expected):
        return 0.0
    common = [pair for pair, p in expected.items() if p * n >= 5]
    observed = [seen.get(pair, 0) for pair in common]
    wanted = [expected[pair] * n for pair in common]
    observed.append(n - sum(observed))
    wanted.append(n - sum(wanted))
    return float(chisquare(observed, wanted).pvalue)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_pairs_follow_the_models_distribution_as_generates_do(temperature, top_p):
    """4,000 two-token samples of one prompt (one group: prefilled once), at fixed seeds, against the exact pair
    probabilities; generate's own samples pass the same test, and samples at another temperature fail it."""
    model = small_model(vocab=12)  # few words: every pair is counted often enough
    with torch.no_grad():  # a peaked distribution, so that another temperature is told apart
        model.get_base_model().lm_head.weight.mul_(10)
    prompt = torch.tensor([[5, 6, 7, 8]])
    expected = exact_pair_probabilities(model, prompt, temperature, top_p)
    rows = prompt.repeat(4000, 1)

    def sampled(ours: bool, t: float, seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        extra = {"custom_generate": decode_loop.decode} if ours else {}
        out = model.generate(
            input_ids=rows,
            attention_mask=torch.ones_like(rows),
            max_new_tokens=2,
            min_new_tokens=2,
            do_sample=True,
            temperature=t,
            top_p=top_p,
            top_k=0,
            pad_token_id=0,
            eos_token_id=None,
            **extra,
        )
        return out[:, -2:]

    for seed in (0, 1):
        assert goodness_of_fit(sampled(True, temperature, seed), expected) > 1e-3
        assert goodness_of_fit(sampled(False, temperature, seed), expected) > 1e-3
    assert goodness_of_fit(sampled(True, temperature + 0.5, 0), expected) < 1e-6  # the test can tell


def test_what_the_loop_does_not_cover_runs_generates_own_loop_and_says_so(caplog, monkeypatch):
    from transformers import MistralConfig, MistralForCausalLM

    monkeypatch.setattr(decode_loop, "_said", set())  # each reason is said once a process
    ids, mask = ragged_prompts()
    model = small_model()
    with caplog.at_level(logging.INFO, logger="dragon_dagster"):
        beams = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=5,
            num_beams=2,
            do_sample=False,
            pad_token_id=0,
            custom_generate=decode_loop.decode,
        )
        plain_beams = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=5, num_beams=2, do_sample=False, pad_token_id=0
        )
        assert torch.equal(beams, plain_beams)
        torch.manual_seed(0)
        mistral = MistralForCausalLM(MistralConfig(vocab_size=300, **SMALL_DECODER)).eval()
        theirs, _ = greedy(mistral, ids, mask, ours=False, max_new_tokens=5)
        ours, _ = greedy(mistral, ids, mask, ours=True, max_new_tokens=5)
        assert torch.equal(ours, theirs)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "beam_search" in said and "'mistral' architecture" in said
    assert decode_loop.unsupported_model(model) is None  # the Llama above decoded in ours


def test_a_streamer_gets_the_prompt_each_token_and_the_end():
    model = small_model()
    ids, mask = ragged_prompts()
    ids, mask = ids[:1], mask[:1]

    class Collect:
        def __init__(self):
            self.put_calls, self.ended = [], False

        def put(self, value):
            self.put_calls.append(value.clone())

        def end(self):
            self.ended = True

    streamer = Collect()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=0,
        custom_generate=decode_loop.decode,
        token_streamer=streamer,
    )
    assert torch.equal(streamer.put_calls[0], ids) and streamer.ended
    assert torch.equal(torch.cat([c.view(-1) for c in streamer.put_calls[1:]]), out[0, ids.shape[1] :])
