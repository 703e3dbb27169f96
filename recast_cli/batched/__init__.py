"""The batched many-seed study engine of the 1-D world (``recast study``): engine, study, commands."""
