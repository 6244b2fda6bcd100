"""Decoding weights (infer/decode_weights.py): adapters folded, weights packed and q/k/v and gate/up run as one
product each while sampling, the same outputs, and everything put back after."""

import pytest
import torch

from tests.support import small_lora_model


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
