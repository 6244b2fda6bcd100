"""The held-out divergence a distill stage reports is the objective TRL's DistillationTrainer minimizes: the same
generalized Jensen-Shannon divergence, per token, at each beta and temperature."""

import pytest
import torch

from dragon_dagster.engine.stages.distill.divergence import generalized_jsd


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_divergence_is_trls_distillation_loss(beta, temperature):
    from trl.trainer.distillation_trainer import _chunked_divergence_loss

    torch.manual_seed(0)
    hidden, vocab = 8, 50
    student_hidden, teacher_hidden = torch.randn(2, 5, hidden), torch.randn(2, 5, hidden)
    student_head, teacher_head = torch.randn(vocab, hidden), torch.randn(vocab, hidden)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    trl_loss, _, _ = _chunked_divergence_loss(
        student_hidden, teacher_hidden, student_head, teacher_head, mask, beta, temperature=temperature
    )
    ours = generalized_jsd(student_hidden @ student_head.T, teacher_hidden @ teacher_head.T, beta, temperature)
    assert ours.shape == (2, 5)
    assert float(ours[mask.bool()].mean()) == pytest.approx(float(trl_loss), rel=1e-4)


def test_forward_and_reverse_kl_are_the_ends_and_zero_for_the_same_model():
    torch.manual_seed(1)
    a, b = torch.randn(4, 30), torch.randn(4, 30)
    p, q = torch.softmax(a, -1), torch.softmax(b, -1)
    forward = (q * (q.log() - p.log())).sum(-1)  # KL(teacher || student), the student a
    reverse = (p * (p.log() - q.log())).sum(-1)
    assert torch.allclose(generalized_jsd(a, b, 0.0), forward, atol=1e-5)
    assert torch.allclose(generalized_jsd(a, b, 1.0), reverse, atol=1e-5)
    assert torch.allclose(generalized_jsd(a, a, 0.5), torch.zeros(4), atol=1e-6)
