"""Reply log-probabilities in batches (issue 63): the head projects only the positions that score a reply token, and
each row's figure is transformers' own loss on that row alone, whatever the other rows of its batch."""

import pytest


def rows() -> list[dict]:
    short = [{"role": "user", "content": "Hub blinks"}]
    long = [
        {"role": "user", "content": "My thermostat shows the wrong temperature every evening since the update."},
        {"role": "assistant", "content": "Which model is it?"},
        {"role": "user", "content": "The Thermostat 2, serial 0A1B2C3D, bought last spring from your shop."},
    ]
    return [
        {"prompt": prompt, "completion": [{"role": "assistant", "content": reply}]}
        for prompt, reply in [
            (short, "Unplug it for ten seconds."),
            (long, "Recalibrate the sensor in Settings > Climate."),
            (short, "Check the Ethernet cable, then restart the hub from the app."),
        ]
    ]


def test_each_rows_reply_log_probability_is_transformers_loss_on_it_alone(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from dragon_dagster.engine.infer.logprobs import completion_loss, encode_reply, reply_logprobs
    from dragon_dagster.engine.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    batched = reply_logprobs(model, tokenizer, rows(), max_len=256, batch_size=3)
    for row, (logp, count) in zip(rows(), batched):
        ids, n_prompt = encode_reply(tokenizer, row, 256)
        labels = torch.tensor([[-100] * n_prompt + ids[n_prompt:]])
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([ids]), labels=labels).loss  # mean NLL over the reply tokens
        assert count == len(ids) - n_prompt
        assert logp == pytest.approx(-float(loss) * count, rel=1e-4)
    figures = completion_loss(model, tokenizer, rows(), max_len=256, batch_size=2)
    assert figures["eval_tokens"] == sum(n for _, n in batched)
    assert figures["row_nll"] == pytest.approx([-logp / n for logp, n in batched], rel=1e-4)
