"""Stage 1, second half: a gain table and budgets λ in, the reward × step matrix W out (E9–E12).

``sinkhorn`` is the method (one function per equation), ``stage`` the ``solve-w`` stage top to
bottom, ``commands`` its CLI command.
"""
