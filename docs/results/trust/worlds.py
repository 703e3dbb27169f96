"""Write the trust study's settings (pipelines/trust/*.toml): the ladder's four worlds as they are, and the new
world ``tug``, each with the trust study's [study] table (preregistration.md).

    python docs/results/trust/worlds.py      # run once, before the study; the files are committed with it

* ``independent``, ``conflict-mild``, ``conflict-strong``, ``control``: ``pipelines/ladder/<world>.toml`` with
  only its [study] arms, seeds and learning-rate ladder replaced (its [world], [train] and [evaluate] unchanged).
* ``tug`` (new, designed before any run of this study): the ladder's mixture with rewards ``sign`` (1{x >= 0},
  decided at the noisy steps), ``upper`` (the right mode of each pair) and ``lowcomb``, the 0.2-cell comb on the
  four modes of x < 0 and 0 on x >= 0 — ``sign`` and ``lowcomb`` can never both hold — under λ = (1, 1, 2): the
  user favours ``lowcomb`` 2 : 1 over ``sign``, while ``sign`` owns the noisy steps where the two are decided.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LADDER = ROOT / "pipelines" / "ladder"
OUT = ROOT / "pipelines" / "trust"
WORLDS = ("independent", "conflict-mild", "conflict-strong", "control", "tug")
ARMS = ["static", "recast:power:estimate", "recast:power:estimate:shrinkauto", "recast:power:estimate:conflict",
        "recast:power"]
SEEDS = "6000:6192"
RATES = [0.02, 0.0282843, 0.04]


def lowcomb() -> tuple[list[float], list[int]]:
    """Edges and values of ``lowcomb``: cell j = floor(x / 0.2) holds j mod 2 for -4.2 <= x < 0, else 0."""
    edges = [round(-4.2 + 0.2 * k, 6) for k in range(22)]  # -4.2 … 0.0
    values = [0] + [(j % 2) for j in range(-21, 0)] + [0]
    return edges, values


def study_table(lam: str) -> str:
    arms = ", ".join(f'"{a}"' for a in ARMS)
    rates = ", ".join(f"{r:g}" for r in RATES)
    return f"""[study]
budgets = [{lam}]
seeds = "{SEEDS}"
arms = [{arms}]
group_sizes = [16]
eval_n = 2048
gains = "exact"
estimate_steps = 25       # the sampled estimate at the base policy (the estimate arms; E14: a pold one beside it)
alpha = 2.0
n = 256
k = 2
p = 4
tau = 1.0
lost_delta = 0.25
learning_rate_ladder = [{rates}]
"""


def from_ladder(world: str) -> str:
    text = (LADDER / f"{world}.toml").read_text()
    head, _, _ = text.partition("\n[study]\n")
    head += "\n"
    head = head.replace("# The ladder study (issue 42, docs/results/ladder/preregistration.md)",
                        "# The trust study (issue 44, docs/results/trust/preregistration.md)")
    head = head.replace("docs/results/ladder/worlds.py", "docs/results/trust/worlds.py from the ladder's")
    lam = re.search(r"^lambda = (\[.*\])$", head, re.M).group(1)
    return head + study_table(lam)


def tug() -> str:
    text = from_ladder("conflict-mild")
    start = text.index("[world.rewards.fine]")
    end = text.index("[train]")
    edges, values = lowcomb()
    rewards = ("[world.rewards.lowcomb]     # the 0.2-cell comb on the modes of x < 0; 0 on x >= 0: never with sign\n"
               f"edges = {edges}\nvalues = {values}\n\n")
    text = text[:start] + rewards + text[end:]
    text = text.replace('rewards = ["sign", "upper", "fine"]', 'rewards = ["sign", "upper", "lowcomb"]')
    text = text.replace("lambda = [1, 1, 1]", "lambda = [1, 1, 2]").replace("budgets = [[1, 1, 1]]",
                                                                            "budgets = [[1, 1, 2]]")
    return text.replace("world conflict-mild.", "world tug (new).")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for world in WORLDS:
        text = tug() if world == "tug" else from_ladder(world)
        (OUT / f"{world}.toml").write_text(text)
        print(f"wrote {OUT / world}.toml")


if __name__ == "__main__":
    main()
