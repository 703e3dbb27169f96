"""Stage 2: ``recast train`` (METHOD.md §6) — online RL with the weight matrix W frozen."""
