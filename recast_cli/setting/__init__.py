"""Setting files: loading a `pipelines/<setting>.toml` (``load``), checking it and every path it names
(``check``), the prompt files it points at (``prompts``), and `recast check-setting` (``commands``)."""
