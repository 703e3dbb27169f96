"""The ``recast`` command: a thin Typer shell over the stage functions.

Conventions every command follows (ARCHITECTURE.md, "CLI contract"): exit 0 on success;
bad input prints one line on stderr and exits 2 with nothing written; anything else is an
internal error (exit 1).
"""

import importlib
import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from recast_cli import __version__, threads
from recast_cli.errors import BadInput
from recast_cli.sinkhorn import DEFAULT_FLOOR, DEFAULT_TAU, SinkhornError

# Click's exceptions, wherever this Typer takes Click from (newer releases vendor it).
click_errors = importlib.import_module(typer.BadParameter.__module__)

out = Console()
err = Console(stderr=True)


#: ``recast --help`` lists the commands in the order of the pipeline, then the tools.
COMMAND_ORDER = ("sample-positive", "estimate", "merge", "compare-gains", "solve-w", "train", "evaluate", "report",
                 "study-makefile", "check-setting", "inspect", "plot", "sample", "score", "serve-reward", "judge",
                 "toy")


class RecastGroup(TyperGroup):
    """Turns every user error, Click's and ours, into one line on stderr and exit code 2."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args=args, prog_name=prog_name or "recast", complete_var=complete_var,
                                standalone_mode=False, **extra)
        except click_errors.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "recast"
            code = _fail(f"{where}: error: {exc.format_message()}", 2)
        except click_errors.ClickException as exc:
            code = _fail(f"recast: error: {exc.format_message()}", exc.exit_code)
        except BadInput as exc:
            code = _fail(f"recast: error: {exc}", 2)
        except SinkhornError as exc:
            code = _fail(f"recast: solver error: {exc}", 1)
        except typer.Abort:
            code = _fail("recast: aborted", 1)
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def _fail(message: str, code: int) -> int:
    line = " ".join(message.split())
    if not line.endswith("error:"):  # Click's "no arguments: show help" carries no message
        sys.stderr.write(line + "\n")
    return code


app = typer.Typer(
    cls=RecastGroup,
    name="recast",
    help="ReCAST: per-reward credit assignment across denoising timesteps for online diffusion RL.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts name tables as [study]: shown as written, not read as markup
)


def _version(value: bool) -> None:
    if value:
        out.print(f"recast {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Stage 1 measures (positives → gains → W), stage 2 uses (train → evaluate → report)."""


@app.command("solve-w")
def solve_w_command(
    gains: Path = typer.Option(..., "--gains", help="Gain table (recast.gains/1 Parquet)."),
    lam: str = typer.Option(..., "--lambda", help="Budgets by position (1,1,2) or by name (clip=1,ocr=2)."),
    out_path: Path = typer.Option(..., "--out", help="Output weight matrix (.safetensors)."),
    mode: str = typer.Option("recast", help="recast (Sinkhorn, E12) | nosink (rows only) | static (λ̂/T) | "
                                            "reversed (recast's columns in reverse step order: a timing control)."),
    tau: float = typer.Option(DEFAULT_TAU, help="Temperature τ of the affinity kernel K = exp(ΔD̄/τ) (E11)."),
    steps: Optional[int] = typer.Option(None, help="Solve on a grid of this many steps (E9 resampling)."),
    grid: Optional[str] = typer.Option(None, help="Grid family for --steps: linear | flowmatch "
                                                  "(default: the one the gain table records)."),
    shift: Optional[float] = typer.Option(None, help="Shift of the flowmatch grid (SD3.5: 3.0)."),
    floor: float = typer.Option(DEFAULT_FLOOR, help="Rows whose total gain is below floor x the largest "
                                                    "are indiscriminable and become uniform (E10)."),
    skip_clean: int = typer.Option(0, "--skip-clean", help="The K cleanest steps t = 1…K are not trained: W = 0 "
                                                           "there, the solve runs over the other T − K steps."),
) -> None:
    """Turn a gain table into the reward x step weight matrix W (E9-E12)."""
    from recast_cli.solve import solve_w

    with err.status("solving W (Sinkhorn)", spinner="dots"):  # on stderr; a long solve (small τ) shows it works
        report = solve_w(gains, lam, out_path, mode=mode, tau=tau, steps=steps, grid=grid, shift=shift,
                         floor=floor, skip_clean=skip_clean)
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    w = report.weights
    info = w.info
    if mode in ("recast", "reversed"):
        out.print(f"Sinkhorn: {info['iterations']} iterations, max marginal error {info['marginal_error']:.2e}")
    if info["resampled"]:
        out.print(f"gains resampled from T = {info['source_T']} to T = {w.T} through D(σ) (E9)")
    trained = f", trained steps {w.skip_clean + 1}…{w.T}" if w.skip_clean else ""
    table = Table(title=f"W ({mode}, τ = {tau:g}, T = {w.T}{trained})", title_justify="left")
    for name in ("reward", "λ", "λ̂", "peak t", "spill <1% peak"):
        table.add_column(name, justify="left" if name == "reward" else "right")
    lam_total = sum(w.lam)
    for i, name in enumerate(w.rewards):
        spill = info["spill_share"][name]
        table.add_row(name, f"{w.lam[i]:g}", f"{w.lam[i] / lam_total:.4f}", str(int(w.gain[i].argmax()) + 1),
                      "—" if spill is None else f"{100 * spill:.1f}%")
    out.print(table)
    out.print(f"wrote {out_path}")


@app.command("estimate")
def estimate_command(
    out_path: Path = typer.Option(..., "--out", help="Gain table to write (recast.gains/1); the scores go to "
                                                     "OUT.scores.parquet."),
    rewards: Optional[str] = typer.Option(None, help="Comma-separated rewards, e.g. clip,hps,pick,ocr."),
    policy: str = typer.Option("toy", help="gmm1d, a setting name (pipelines/NAME.toml), a .toml path, or a "
                                           "recast train run / checkpoint folder (its setting + LoRA)."),
    positives: Optional[Path] = typer.Option(None, help="recast.positives/1 folder (π⁺ surrogate images)."),
    prompts: Optional[Path] = typer.Option(None, help="Prompts file (π^old-sampling without positives)."),
    alpha: str = typer.Option("2", help="Rényi order(s), e.g. 2 or 0.25,0.5,2,4: one table per α, "
                                        "OUT-alpha{α}.parquet when several."),
    beta: Optional[float] = typer.Option(None, help="Tilt β of π⁺ ∝ π·exp(r̃/β) (default 1; gmm1d 0.5)."),
    standardise: Optional[bool] = typer.Option(None, "--standardise/--raw",
                                               help="Standardise rewards per prompt (default; gmm1d: raw)."),
    steps: int = typer.Option(25, help="Grid T of the estimate."),
    n: int = typer.Option(8, "--n", help="Positive samples per prompt (N)."),
    k: int = typer.Option(16, "--k", help="Rollouts per (sample, t) (K)."),
    p: Optional[int] = typer.Option(None, "--p", help="Use the first P prompts (gmm1d: P replicates, default 4)."),
    sampling: str = typer.Option("pplus", help="pplus (E6, default) | pold (E8)."),
    crn: bool = typer.Option(True, "--crn/--no-crn", help="Common random numbers across t."),
    rollout_noise: float = typer.Option(1.414, help="SDE noise level a of the rollouts (√2: exact reversal)."),
    guidance_scale: Optional[float] = typer.Option(None, "--cfg", help="CFG scale defining π^old."),
    monotone: str = typer.Option("isotonic", help="isotonic (default) | clip: how gains are made ≥ 0."),
    bootstrap: int = typer.Option(200, help="Bootstrap resamples over prompts (0: none)."),
    jackknife: bool = typer.Option(False, help="Delete-one-k jackknife against finite-K bias (α ≠ 2)."),
    seed: int = typer.Option(0),
    batch_size: int = typer.Option(64, help="Rollouts per model batch (does not change results)."),
    shard: Optional[str] = typer.Option(None, help="i/n: this process's share of prompts; merge with recast merge."),
    exact: bool = typer.Option(False, help="gmm1d only: write the exact curves in the same schema."),
    from_scores: Optional[Path] = typer.Option(None, help="Recompute gains from a recast.scores/1 table "
                                                          "(no rollouts). With several --alpha values each table "
                                                          "goes to OUT-alpha{α}.parquet."),
) -> None:
    """Stage 1: Rényi gain curves per reward and step (E3-E8) to Parquet."""
    from recast_cli.estimate import stage

    opts = stage.GainOptions(alphas=stage.parse_alphas(alpha), beta=beta, standardise=standardise,
                             monotone=monotone, bootstrap=bootstrap, jackknife=jackknife)
    stage.check_gain_options(opts)
    outs = stage.output_paths(out_path, opts.alphas)
    if from_scores is not None:
        from recast_cli.artifacts import check_writable, read_scores

        for path in outs:
            check_writable(path, inputs=[from_scores])
        stage.gains_from_scores(read_scores(from_scores), opts, outs, from_scores)
        written = outs
    else:
        if rewards is None:
            raise BadInput("--rewards is required (e.g. --rewards toy_color,toy_shape,toy_sharpness)")
        cfg = stage.EstimateConfig(
            policy=policy, rewards=tuple(r.strip() for r in rewards.split(",") if r.strip()), steps=steps, N=n, K=k,
            P=p, sampling=sampling, crn=crn, rollout_noise=rollout_noise, guidance_scale=guidance_scale, seed=seed,
            batch_size=batch_size, positives=str(positives) if positives else None,
            prompts_file=str(prompts) if prompts else None)
        if exact:
            stage.check_config(cfg, opts)
            stage.exact_table(cfg, opts, out_path)
            written = outs
        else:
            written = stage.estimate(cfg, opts, out_path, shard=shard)
    for path in written:
        out.print(f"wrote {path}")


@app.command("merge")
def merge_command(
    shards: list[Path] = typer.Argument(..., help="Scores tables of the shards of one run (OUT.scores.parquet)."),
    out_path: Path = typer.Option(..., "--out", help="Gain table to write; merged scores go to OUT.scores.parquet."),
    alpha: str = typer.Option("2", help="Rényi order(s) α, comma-separated (several: OUT-alpha{α}.parquet each)."),
    beta: Optional[float] = typer.Option(None, help="Tilt temperature β (default 1; 0.5 in the analytic world)."),
    standardise: Optional[bool] = typer.Option(None, "--standardise/--raw",
                                               help="Divide each reward by its std under π^old (default: on)."),
    monotone: str = typer.Option("isotonic", help="Make the gains non-negative: isotonic (PAVA) or clip."),
    bootstrap: int = typer.Option(200, help="Bootstrap resamples over prompts for the intervals (0: none)."),
    jackknife: bool = typer.Option(False, help="Delete-one-k jackknife against finite-K bias (α ≠ 2)."),
) -> None:
    """Merge the scores of a sharded run and compute its gain tables (equal to an unsharded run)."""
    from recast_cli.artifacts import Source, check_writable, read_scores, write_scores
    from recast_cli.estimate import stage

    opts = stage.GainOptions(alphas=stage.parse_alphas(alpha), beta=beta, standardise=standardise,
                             monotone=monotone, bootstrap=bootstrap, jackknife=jackknife)
    stage.check_gain_options(opts)
    outs = stage.output_paths(out_path, opts.alphas)
    merged_path = stage.scores_path(out_path)
    for path in (merged_path, *outs):
        check_writable(path, inputs=shards)
    merged = stage.merge_scores(shards)
    write_scores(merged_path, merged, config={"command": "merge"}, sources=[Source.of(s) for s in shards])
    stage.gains_from_scores(read_scores(merged_path), opts, outs, merged_path)
    for path in (merged_path, *outs):
        out.print(f"wrote {path}")


@app.command("inspect")
def inspect_command(
    path: Path = typer.Argument(..., help="Any artifact: a gain, scores, evaluation, metrics, image-scores or "
                                          "judgements table (.parquet), a weight matrix (.safetensors), or a "
                                          "positives, run or checkpoint folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also write Fig. 1 (gains, normalised gains, W) as PNG."),
) -> None:
    """Show any artifact's schema, provenance and summary (per reward, per scorer, per checkpoint)."""
    from recast_cli.summary import load_artifact, render, summarise

    if plot is not None:
        from recast_cli.artifacts import check_writable

        check_writable(plot, inputs=[path])
    artifact = load_artifact(path)
    summary = summarise(artifact)
    if plot is not None and summary["kind"] not in ("gains", "weights"):
        raise BadInput(f"--plot draws Fig. 1 from a gain table or a weight matrix; {path} is a {summary['kind']} artifact")
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    else:
        render(summary, str(path), out)
    if plot is not None:
        _write_plot(plot, title=str(path), **{summary["kind"]: artifact})


@app.command("plot")
def plot_command(
    out_path: Path = typer.Option(..., "--out", help="Output PNG."),
    gains: Optional[Path] = typer.Option(None, "--gains", help="Gain table (recast.gains/1)."),
    weights: Optional[Path] = typer.Option(None, "--weights", help="Weight matrix (recast.weights/1)."),
    d_curves: bool = typer.Option(False, "--d-curves", help="Plot the D curves with bootstrap bands instead."),
) -> None:
    """Write Figure 1 of the paper: per-step gains, mean-normalised gains and W (t/T from clean to noisy)."""
    from recast_cli.artifacts import check_writable, read_gains, read_weights

    if gains is None and weights is None:
        raise BadInput("recast plot needs --gains, --weights or both")
    if d_curves and gains is None:
        raise BadInput("--d-curves needs --gains")
    check_writable(out_path, inputs=[gains, weights])
    table = read_gains(gains) if gains is not None else None
    if d_curves:
        from recast_cli.report.figures import figure_d_curves, save_figure

        save_figure(figure_d_curves(table, title=str(gains)), out_path)
        out.print(f"wrote {out_path}")
        return
    matrix = read_weights(weights) if weights is not None else None
    _write_plot(out_path, title=" + ".join(str(p) for p in (gains, weights) if p is not None),
                gains=table, weights=matrix)


@app.command("sample")
def sample_command(
    out_dir: Path = typer.Option(..., "--out", help="Folder for the PNGs."),
    setting: str = typer.Option("toy", help="Setting name (pipelines/NAME.toml) or a .toml path."),
    prompt: list[str] = typer.Option(..., "--prompt", help="Prompt (repeat for several)."),
    n: int = typer.Option(4, "--n", help="Images per prompt."),
    seed: int = typer.Option(0, help="Image i of a prompt uses seed + i."),
    steps: Optional[int] = typer.Option(None, help="Sampling steps (default: the setting's)."),
    guidance_scale: Optional[float] = typer.Option(None, "--cfg", help="CFG scale (default: the setting's)."),
    noise_level: float = typer.Option(0.0, help="SDE noise level a (0: deterministic ODE)."),
    batch: int = typer.Option(8, help="Images per model batch."),
    device: Optional[str] = typer.Option(None, help="torch device (default: cuda if available)."),
) -> None:
    """Sample images from a setting's policy and write them as PNGs."""
    from recast_cli.sample import sample_images
    from recast_cli.settings import build_policy, check_prompts, load_setting

    if n < 1 or batch < 1:
        raise BadInput("--n and --batch must be at least 1")
    if steps is not None and steps < 1:
        raise BadInput(f"--steps must be at least 1, got {steps}")
    if noise_level < 0:
        raise BadInput(f"--noise-level must be >= 0, got {noise_level}")
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"cannot write into {out_dir}: it is not a directory")
    spec = load_setting(setting).policy
    check_prompts(spec, prompt)
    policy = build_policy(spec, device=device, steps=steps, guidance_scale=guidance_scale)
    paths = sample_images(policy, prompt, n, out_dir, seed=seed, noise_level=noise_level, batch=batch)
    out.print(f"wrote {len(paths)} images to {out_dir}")


toy_app = typer.Typer(help="The toy world: pretraining its tiny SD3-architecture model.", no_args_is_help=True,
                      rich_markup_mode=None)
app.add_typer(toy_app, name="toy")


@toy_app.command("pretrain")
def toy_pretrain_command(
    out_dir: Path = typer.Option(Path("pipelines/toy/model"), "--out", help="Model folder to write."),
    work: Path = typer.Option(Path("artifacts/toy-pretrain"), help="Checkpoints; rerun to resume."),
    seed: int = typer.Option(0),
    vae_steps: int = typer.Option(1000, help="Autoencoder steps."),
    steps: int = typer.Option(8000, help="Flow-matching steps of the transformer."),
    batch: int = typer.Option(48),
) -> None:
    """Train the toy model on renderer images (resumable), write it in diffusers layout."""
    from recast_cli.toy.pretrain import PretrainConfig, pretrain

    if min(vae_steps, steps, batch) < 1:
        raise BadInput("--vae-steps, --steps and --batch must be at least 1")
    cfg = PretrainConfig(seed=seed, vae_steps=vae_steps, steps=steps, batch=batch)
    command = (f"recast toy pretrain --out {out_dir} --work {work} --seed {seed} --vae-steps {vae_steps} "
               f"--steps {steps} --batch {batch}")
    provenance = pretrain(out_dir, work, cfg, command)
    out.print(f"wrote {out_dir} (final losses: {provenance['final_loss']})")


@toy_app.command("quality")
def toy_quality_command(
    model: Path = typer.Option(Path("pipelines/toy/model"), help="Toy model folder."),
    n: int = typer.Option(4, "--n", help="Images per prompt (24 prompts)."),
    seed: int = typer.Option(1000),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Toy rewards on renderer images vs the model's samples vs a random-initialised model."""
    import tempfile

    from recast_cli.toy.quality import TOY_REWARDS, quality

    if n < 1:
        raise BadInput("--n must be at least 1")
    with tempfile.TemporaryDirectory() as work:
        result = quality(model, n=n, seed=seed, work=work)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    table = Table(title=f"toy rewards, mean over 24 prompts x {n} images (ODE samples, 10 steps, CFG 4.5)")
    table.add_column("images")
    for name in TOY_REWARDS:
        table.add_column(name, justify="right")
    for label, means in result.items():
        table.add_row(label, *(f"{means[name]:.3f}" for name in TOY_REWARDS))
    out.print(table)


def _write_plot(path: Path, title: str, gains: Any = None, weights: Any = None) -> None:
    from recast_cli.report.figures import figure_from_artifacts, save_figure

    save_figure(figure_from_artifacts(gains=gains, weights=weights, title=title), path)
    out.print(f"wrote {path}")


from recast_cli.rewards.commands import register as register_reward_commands  # noqa: E402

register_reward_commands(app)
from recast_cli.positives.commands import register as register_positive_commands  # noqa: E402
register_positive_commands(app)
from recast_cli.train.commands import register as register_train_commands  # noqa: E402

register_train_commands(app)
from recast_cli.settings_check import register as register_check_setting  # noqa: E402
register_check_setting(app)
from recast_cli.evaluate.commands import register as register_evaluate_commands  # noqa: E402
register_evaluate_commands(app)
from recast_cli.report import register as register_report_command  # noqa: E402
register_report_command(app)
from recast_cli.study import register as register_study_command  # noqa: E402
register_study_command(app)


def main() -> None:
    try:
        threads.apply()  # before any command imports torch (recast_cli/threads.py has the rule)
    except BadInput as exc:
        sys.exit(_fail(f"recast: error: {exc}", 2))
    app()
