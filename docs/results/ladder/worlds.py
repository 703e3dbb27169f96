"""Write the ladder study's four settings (pipelines/ladder/*.toml) from one template.

Run once before the study (``python docs/results/ladder/worlds.py``); the settings it writes are
committed with the pre-registration and are what the study runs. The worlds are fixed by
preregistration.md; the learning-rate ladder and the seeds are filled in by the rules there
(``--ladder`` and ``--seeds``), after the pilot, and committed before the study runs.

* ``independent`` — the dose-response study's m = 3 ladder world (sign, upper, comb).
* ``conflict-mild``, ``conflict-strong`` — the same mixture and sign and upper rewards; the fine
  reward ``fine`` is the comb on the four *lower* modes of the pairs but, on the four *upper*
  modes, 1 only on a window of width w around the mode's centre (w = 0.12 and 0.04). upper and fine
  then hold together only on those windows: 4·w of the line, 0.5·P(|z| < w/0.24) of π^old's mass
  (0.19 and 0.066; 0.25 in the independent world). Where the window is narrow, fine is easier in
  the lower modes than in the upper ones, so its gradient pulls against upper.
* ``control`` — two mirror-image rewards, right = 1{x ≥ −2} and left = 1{x < 2}, both satisfied on
  (−2, 2): identical exact gain curves, so the exact W is static.
"""

from __future__ import annotations

import argparse
from pathlib import Path

MEANS = [-3.8, -3.0, -1.8, -1.0, 1.0, 1.8, 3.0, 3.8]
UPPER = [-3.0, -1.0, 1.8, 3.8]  # the right mode of each pair
REACH = 0.4  # each mode's cells span its centre ± 0.4 (3.3 std; the pairs are 0.8 apart)
CELL = 0.2
WINDOWS = {"conflict-mild": 0.12, "conflict-strong": 0.04}
ROOT = Path(__file__).resolve().parents[3]
#: The pilot's rates: 0.01·√2^k, k = 0 … 6 (preregistration.md).
PILOT_RATES = [round(0.01 * 2 ** (k / 2), 6) for k in range(7)]


def fine_cells(window: float) -> tuple[list[float], list[int]]:
    """Edges and values of ``fine``: per mode, the odd 0.2-cells (lower modes) or the centre window (upper)."""
    edges: list[float] = []
    values: list[int] = [0]
    for c in MEANS:
        if c in UPPER:
            cuts = [round(c - REACH, 6), round(c - window / 2, 6), round(c + window / 2, 6), round(c + REACH, 6)]
            vals = [0, 1, 0]
        else:
            k0 = round((c - REACH) / CELL)
            cuts = [round((k0 + i) * CELL, 6) for i in range(int(round(2 * REACH / CELL)) + 1)]
            vals = [(k0 + i) % 2 for i in range(len(cuts) - 1)]
        for e, v in zip(cuts, vals + [0]):
            if edges and abs(edges[-1] - e) < 1e-9:  # a shared edge: the new cell's value replaces the 0 after it
                values[-1] = v
                continue
            edges.append(e)
            values.append(v)
    return edges, values


HEAD = """# The ladder study (issue 42, docs/results/ladder/preregistration.md): world {name}.
# Written by docs/results/ladder/worlds.py; frozen by the pre-registration before the study ran.

[policy]
kind = "flow1d"
steps = 25                # linear grid sigma_t = t/T
noise_level = 0.7         # training SDE noise level a
features = 6
hidden = 32

# The ladder mixture: eight modes from three binary splits (+-2.4, then +-1.0, then +-0.4), std 0.12.
[world]
weights = [0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125]
means = [-3.8, -3.0, -1.8, -1.0, 1.0, 1.8, 3.0, 3.8]
stds = 0.12
"""

SIGN_UPPER = """
[world.rewards.sign]        # 1{x >= 0}: which half
threshold = 0.0

[world.rewards.upper]       # the right mode of each pair
edges = [-3.4, -2.4, -1.4, 0.0, 1.4, 2.4, 3.4]
values = [0, 1, 0, 1, 0, 1, 0, 1]
"""

TAIL = """
[train]
rewards = {rewards}
lambda = {lam}
prompts = "../twoscale/prompts.txt"   # the world is unconditional: one prompt
train_fraction = 1.0
lora_rank = 0
max_steps = 30
group_size = 16
prompts_per_step = 16     # 256 rollouts per step
micro_batch = 6400
sample_batch = 256
learning_rate = 2e-2      # unused by the study: every arm runs at every rung of [study] learning_rate_ladder
clip_range = 0.2
beta_kl = 0.0
save_every = 3            # ten checkpoints: 3, 6, ..., 30
keep_checkpoints = 10

[evaluate]
n = 2048
seed = 10000
batch_size = 2048
judges = []

[study]
budgets = [{lam}]
seeds = "{seeds}"
arms = ["static", "recast:power", "recast:power:estimate", "recast:power:estimate:shrink0.5"]
group_sizes = [16]
eval_n = 2048
gains = "exact"
estimate_steps = 25       # the sampled estimate at the base policy (the estimate arms)
alpha = 2.0
n = 256
k = 2
p = 4
tau = 1.0
lost_delta = 0.25
learning_rate_ladder = {ladder}
"""


def setting(name: str, ladder: list[float], seeds: str, pilot: bool = False) -> str:
    if name == "control":
        rewards = """
[world.rewards.right]       # 1{x >= -2}
threshold = -2.0

[world.rewards.left]        # 1{x < 2}: its mirror image, left(x) = right(-x)
edges = [2.0]
values = [1, 0]
"""
        names = ["right", "left"]
    elif name == "independent":
        rewards = SIGN_UPPER + """
[world.rewards.comb]        # the odd 0.2-cells: detail inside a mode
cell = 0.2
pattern = [0, 1]
"""
        names = ["sign", "upper", "comb"]
    else:
        edges, values = fine_cells(WINDOWS[name])
        rewards = SIGN_UPPER + f"""
[world.rewards.fine]        # the comb on the lower modes; on the upper modes, a window of width {WINDOWS[name]:g} at the centre
edges = {edges}
values = {values}
"""
        names = ["sign", "upper", "fine"]
    lam = "[" + ", ".join("1" for _ in names) + "]"
    rungs = "[" + ", ".join(f"{r:.6g}" for r in ladder) + "]"
    text = (HEAD.format(name=name) + rewards +
            TAIL.format(rewards="[" + ", ".join(f'"{n}"' for n in names) + "]", lam=lam, seeds=seeds, ladder=rungs))
    if pilot:  # static only, one folder deeper
        text = text.replace('arms = ["static", "recast:power", "recast:power:estimate", "recast:power:estimate:shrink0.5"]',
                            'arms = ["static"]').replace('"../twoscale/prompts.txt"', '"../../twoscale/prompts.txt"')
        text = text.replace("# The ladder study (issue 42", "# The ladder study's PILOT (issue 42")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ladder", default="0.02,0.028284,0.04,0.056569", help="the rungs, comma-separated")
    parser.add_argument("--seeds", default="5000:5324", help="LO:HI")
    parser.add_argument("--pilot", action="store_true", help="write the pilot's settings (static only, seven rates, "
                        "seeds 2000:2064) to pipelines/ladder/pilot/")
    args = parser.parse_args()
    out = ROOT / "pipelines" / "ladder"
    ladder = [float(x) for x in args.ladder.split(",")]
    names: tuple[str, ...] = ("independent", *WINDOWS, "control")
    if args.pilot:
        out, ladder, args.seeds, names = out / "pilot", PILOT_RATES, "2000:2064", ("independent", *WINDOWS)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        (out / f"{name}.toml").write_text(setting(name, ladder, args.seeds, pilot=args.pilot))


if __name__ == "__main__":
    main()
