"""One registry of scorer names: name → "module:Class", imported only when built.

Three ways to name a scorer wherever recast takes rewards (``--rewards``, ``[train] rewards``,
``[rewards.NAME]``, judges):

* a built-in name (:data:`SCORERS`);
* a name an installed package registers in the entry-point group ``recast.rewards``
  (``[project.entry-points."recast.rewards"] my_reward = "my_pkg.rewards:MyScorer"``);
  built-in names win over a plug-in of the same name;
* a reference ``module.path:ClassName`` to any importable class implementing
  :class:`~recast_cli.rewards.base.Scorer` (docs/rewards.md, "Your own reward").

``NAME@URL`` is the client of a ``recast serve-reward NAME`` server. Lazy imports keep heavy
stacks (open_clip, OCR runtimes, HTTP clients, a plug-in's own) out of commands that do not
use them.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from recast_cli.errors import BadInput
from recast_cli.rewards.base import Scorer

SCORERS: dict[str, str] = {
    "clip": "recast_cli.rewards.clip:ClipScore",
    "hps": "recast_cli.rewards.hps:HpsScore",
    "pick": "recast_cli.rewards.pick:PickScore",
    "ocr": "recast_cli.rewards.ocr:OcrScore",
    "geneval": "recast_cli.rewards.geneval:GenEvalScore",
    "aesthetic": "recast_cli.rewards.aesthetic:AestheticScore",
    "imagereward": "recast_cli.rewards.imagereward:ImageRewardScore",
    "hpsv3": "recast_cli.rewards.hpsv3:Hpsv3Score",
    "unifiedreward": "recast_cli.rewards.unifiedreward:UnifiedRewardScore",
    "remote": "recast_cli.rewards.remote:RemoteScorer",
    "toy_color": "recast_cli.toy.rewards:ToyColor",
    "toy_shape": "recast_cli.toy.rewards:ToyShape",
    "toy_sharpness": "recast_cli.toy.rewards:ToySharpness",
    "coarse": "recast_cli.policy.gmm1d:Coarse",
    "mid": "recast_cli.policy.gmm1d:Mid",
    "fine": "recast_cli.policy.gmm1d:Fine",
    "fine_wide": "recast_cli.policy.gmm1d:FineWide",
}


#: the entry-point group through which installed packages register scorer names
PLUGIN_GROUP = "recast.rewards"


def plugin_scorers() -> dict[str, str]:
    """Names registered by installed packages (entry-point group ``recast.rewards``) → "module:Class"."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP) if ep.name not in SCORERS}


def scorer_names() -> tuple[str, ...]:
    """Every registered name: the built-ins, then the installed plug-ins'."""
    return (*SCORERS, *plugin_scorers())


def is_reference(name: str) -> bool:
    """``module.path:ClassName`` (before any ``@URL``): a scorer named by its class."""
    return ":" in name.split("@", 1)[0]


def is_known(name: str) -> bool:
    """A registered name, or a reference whose class loads (BadInput says why one does not)."""
    if is_reference(name):
        scorer_class(name)
        return True
    return name.split("@", 1)[0] in scorer_names()


def scorer_class(name: str) -> type[Scorer]:
    """The class of ``name`` (``NAME@URL`` is the remote client); BadInput if unknown or unusable."""
    base = name.split("@", 1)[0]
    if "@" in name:
        target = SCORERS["remote"]
    elif is_reference(base):
        target = base
    else:
        registered = {**SCORERS, **plugin_scorers()}
        if base not in registered:
            raise BadInput(f"unknown scorer {base!r}; known: {', '.join(registered)}")
        target = registered[base]
    return _load(target, base)


def _load(target: str, name: str) -> type[Scorer]:
    module_name, _, class_name = target.partition(":")
    if not (module_name and class_name and class_name.isidentifier()
            and all(part.isidentifier() for part in module_name.split("."))):
        raise BadInput(f"reward {name!r}: a scorer reference is MODULE:CLASS, e.g. my_pkg.rewards:MyScorer")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise BadInput(f"reward {name!r}: no module named {exc.name!r} (is its package installed, or on "
                       "PYTHONPATH?)") from None
    except Exception as exc:  # a plug-in's own import error, reported in one line
        raise BadInput(f"reward {name!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise BadInput(f"reward {name!r}: module {module_name} has no {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Scorer)):
        raise BadInput(f"reward {name!r}: {target} is not a Scorer (subclass recast_cli.rewards.base.Scorer)")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise BadInput(f"reward {name!r}: {target} does not implement {missing}")
    return cls


def build_scorer(name: str, **options: Any) -> Scorer:
    """Instantiate the scorer registered as ``name`` with its options (paths, device, ...).

    ``NAME@URL`` builds the client of a ``recast serve-reward NAME`` server at URL instead,
    which checks that the server serves NAME.
    """
    cls = scorer_class(name)
    if "@" in name:
        base, url = name.split("@", 1)
        options = {**options, "url": url, "name": base}
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            raise BadInput(f"{name}: unknown option {', '.join(unknown)}; it takes {', '.join(params) or 'none'}")
    missing = [k for k, p in params.items() if p.default is inspect.Parameter.empty and k not in options
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        raise BadInput(f"{name}: needs option {', '.join(missing)} (e.g. --opt {name}.{missing[0]}=VALUE)")
    return cls(**options)
