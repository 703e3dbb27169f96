"""A setting's ``[study]``: the table and its arms (``spec``), the study as a Make graph for
`make all SETTING=…` (``makefile``), and `recast study-makefile` (``commands``)."""
