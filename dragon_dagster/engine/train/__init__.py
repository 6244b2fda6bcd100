"""What every training stage kind shares: settings base and adapter check (stage.py), the trainer plumbing
(trainer.py), the preference kinds' common run (preference.py), the reinforcement kinds' (reinforce/), data
parallelism (distributed.py) and the fast paths (lm_head.py, preference_head.py, unpadded.py, dropout.py,
rollout.py). The kinds are stages/<kind>/."""
