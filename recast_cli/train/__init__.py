"""Stage 2: ``recast train`` (docs/method.md §6) — online RL with the weight matrix W frozen."""
