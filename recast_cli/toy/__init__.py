"""The toy world: a procedural renderer (the π⁺ "strong generator") and rewards with known timing."""
