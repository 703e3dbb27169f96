"""``recast inspect``: read any artifact (``load``), summarise it as JSON (``summarise``), render it (``render``)."""

from recast_cli.inspect.load import INSPECT_READERS, load_artifact
from recast_cli.inspect.render import render, sparkline
from recast_cli.inspect.summarise import json_safe, summarise

__all__ = ["INSPECT_READERS", "json_safe", "load_artifact", "render", "sparkline", "summarise"]
