"""Flow-matching policies behind one protocol (ARCHITECTURE.md, "The policy protocol").

``base`` is the protocol (step, mixed-t rollouts, trajectories), ``sde`` the E1 step, ``sd3``,
``gmm1d`` and ``flow1d`` the policies, ``sample`` and ``commands`` ``recast sample``. Nothing is
imported here, so that ``recast --help`` loads no torch.
"""
