"""recast: per-reward credit assignment across denoising timesteps (ReCAST) for online diffusion RL."""

__version__ = "0.1.0"
