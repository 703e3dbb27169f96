"""``recast inspect``: read any artifact, summarise it as JSON, render it with rich.

One row of :data:`~recast_cli.inspect.kinds.KINDS` per artifact kind says how: its schema tag, its
reader (``load``), its summariser (``summarise``) and its renderer (``render``).
"""

from recast_cli.inspect.kinds import KINDS, Kind, load_artifact, render, summarise
from recast_cli.inspect.summarise import json_safe, sparkline

__all__ = ["KINDS", "Kind", "json_safe", "load_artifact", "render", "sparkline", "summarise"]
