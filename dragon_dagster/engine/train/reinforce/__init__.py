"""What the reinforcement kinds (stages/grpo, stages/rloo) share: settings, trainer, run, result and checks."""
