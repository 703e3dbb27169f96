"""Stage 2, evaluation: held-out prompts, deterministic ODE samples, rewards and judges per image."""
