"""Stage 1, ``recast estimate``: rollouts and scores (``rollouts``), gain curves (``gains``), the stage (``stage``)."""
