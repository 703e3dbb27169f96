"""``recast fetch SETTING``: the one command that downloads — Hub models into the HF cache, pinned
prompt files into the setting's data paths (docs/fetch.md)."""
