"""Trainers (SFT, DPO/ORPO, GRPO) on LoRA adapters, their shared plumbing, the fast loss head, the merge."""
