"""The adaptive KL controller (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", as TRL's
PPO had it): the KL coefficient moved after each logged step so that the policy's KL to the starting model holds
near a target, instead of a fixed `beta` that is too weak early or too strong late.

    error = clip(KL / target - 1, -0.2, 0.2);  beta <- beta * (1 + error * completions / horizon)

`horizon` counts completions: the larger it is, the slower beta moves (at the clip, by 20% over a horizon's worth
of completions). Both TRL trainers read their `beta` attribute at every step (GRPO in the loss, RLOO in the
reward), so setting it is all the controller does to them.
"""

from __future__ import annotations

from dataclasses import dataclass

CLIP = 0.2  # the most the proportional error counts, either way


@dataclass
class AdaptiveKL:
    value: float  # the coefficient now (the stage's beta to start)
    target: float  # the KL to hold
    horizon: int  # completions over which an error at the clip moves the coefficient by CLIP

    def update(self, kl: float, completions: int) -> float:
        """The coefficient after a step of `completions` samples whose mean KL was `kl`."""
        error = max(-CLIP, min(CLIP, kl / self.target - 1))
        self.value *= 1 + error * completions / self.horizon
        return self.value


def kl_control_callback(controller: AdaptiveKL, completions_per_step: int):
    """A TrainerCallback that updates the controller from each log's `kl`, sets the trainer's beta (assign
    `.trainer` before training) and adds `beta` to the log, so the progress file and MLflow show it per step. It must
    come before the progress callback in the trainer's list, which reads the log after it."""
    from transformers import TrainerCallback

    class KLControl(TrainerCallback):
        trainer = None
        last_step = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is None or not isinstance(logs.get("kl"), (int, float)) or self.trainer is None:
                return
            steps, self.last_step = state.global_step - self.last_step, state.global_step
            self.trainer.beta = controller.update(float(logs["kl"]), max(steps, 1) * completions_per_step)
            logs["beta"] = self.trainer.beta

    return KLControl()
