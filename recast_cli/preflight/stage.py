"""``recast preflight``: a setting's policy at its real architecture, checked on random weights
before real weights and GPU hours are spent.

Phase ``build``: every component of the setting's pipeline is built from its config on the
``meta`` device — shapes, no memory, no weights, seconds even for SD3.5-Medium's 2.2 B-parameter
transformer and 4.8 B-parameter T5-XXL encoder — and counted: parameters per component, the LoRA
parameters ``[train]`` would train (rank r on every targeted linear layer: r·(in + out) each),
and the bytes of the weights at the setting's precision. Configs come from the setting's model
folder when it is there, else from the shipped architecture configs (``pipelines/configs/``);
``--scale tiny`` builds the ``recast tiny-model`` architecture of the same family instead.

The build phase also places every reward and judge and counts the networks of those that run in
this process at their real architectures (:mod:`recast_cli.preflight.rewards`): CLIP ViT-L/14,
PickScore's CLIP-H/14, HPSv2's open_clip ViT-H-14, ImageReward's BLIP, the aesthetic CLIP + MLP;
served ones (UnifiedReward's vLLM server, ``NAME@URL``) are named and not counted.

Phases ``rewards``, ``estimate``, ``train`` and ``evaluate`` (:mod:`recast_cli.preflight.phases`)
run the stages' own code on the same architecture with random weights (:func:`random_pipeline`:
built with its parameters on ``meta``, materialised on the device and initialised there), with the
reward networks on random weights too, on CUDA when there is one, at the setting's precision; the
train step runs once more with the text encoders offloaded the other way than the setting's.

The JSON written is ``recast.preflight/1``: recast/torch/diffusers versions, device, dtype,
engine, parameters, host RSS, whether everything fit, and per phase its seconds and numbers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recast_cli import __version__
from recast_cli.artifacts import atomic_write_bytes, claim_output
from recast_cli.errors import BadInput
from recast_cli.policy.lora import lora_parameters
from recast_cli.preflight.phases import INIT, materialise
from recast_cli.preflight.rewards import rewards_build
from recast_cli.preflight.compute import step_compute
from recast_cli.policy.families import FAMILIES, family
from recast_cli.setting.load import PIPELINES
from recast_cli.train.config import trained_steps

PREFLIGHT_SCHEMA = "recast.preflight/1"
PHASES = ("build", "rewards", "estimate", "train", "evaluate")
SCALES = ("full", "tiny")
BYTES = {"bf16": 2, "fp16": 2, "no": 4, "fp32": 4}
#: component folder → how its config builds a module (library, class)
SD3_COMPONENTS = {
    "transformer": ("diffusers", "SD3Transformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
    "text_encoder": ("transformers", "CLIPTextModelWithProjection"),
    "text_encoder_2": ("transformers", "CLIPTextModelWithProjection"),
    "text_encoder_3": ("transformers", "T5EncoderModel"),
}


def parse_phases(text: str) -> tuple[str, ...]:
    phases = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in phases if p not in PHASES]
    if not phases or unknown:
        raise BadInput(f"--phases takes {','.join(PHASES)} (comma-separated), got {text!r}")
    return phases


def config_folder(setting, scale: str) -> tuple[Path | None, str]:
    """(the folder whose component configs to build, what it is); None for the tiny architecture."""
    spec = setting.policy
    if spec.kind in ("gmm1d", "flow1d"):
        raise BadInput(f"setting {setting.name!r}: recast preflight builds sd3 policies; {spec.kind!r} has no "
                       "architecture to check (the analytic worlds are exact)")
    shipped = family(spec.kind).preflight  # the family table: the families preflight builds have shipped configs
    if shipped is None:
        builds = ", ".join(k for k, f in FAMILIES.items() if f.preflight is not None)
        raise BadInput(f"setting {setting.name!r}: recast preflight builds {builds} policies so far; for a "
                       f"{spec.kind} setting, smoke-test it on `recast tiny-model --family {spec.kind}` (README, "
                       "Tiny models)")
    if scale == "tiny":
        return None, f"the recast tiny-model {spec.kind} architecture"
    folder = spec.folder(required=False)
    if folder is not None and (folder / "model_index.json").is_file():
        return folder, f"the model folder {folder}"
    return PIPELINES / shipped, (f"the shipped configs {(PIPELINES / shipped).relative_to(PIPELINES.parent)} "
                                 f"(no model folder at {spec.model_name()})")


def _module(folder: Path, name: str, empty: Callable[[], Any]):
    library, cls_name = SD3_COMPONENTS[name]
    path = folder / name / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from None
    with empty():
        if library == "diffusers":
            import diffusers

            return getattr(diffusers, cls_name).from_config(config)
        import transformers

        cls = getattr(transformers, cls_name)
        return cls(cls.config_class(**{k: v for k, v in config.items() if k != "architectures"}))


def _tiny_pipeline(empty: Callable[[], Any]):
    from recast_cli.policy.tiny import build_pipeline
    from recast_cli.toy.pretrain import toy_words

    with empty():
        return build_pipeline("sd3", toy_words())


def _models(pipe) -> dict[str, Any]:
    import torch

    return {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}


def _components(folder: Path | None, empty: Callable[[], Any]) -> dict[str, Any]:
    """Every model component, built inside ``empty()`` (the meta device, or meta parameters only)."""
    if folder is None:
        return _models(_tiny_pipeline(empty))
    present = [n for n in SD3_COMPONENTS if (folder / n / "config.json").is_file()]
    if "transformer" not in present:
        raise BadInput(f"{folder}: no transformer/config.json")
    return {name: _module(folder, name, empty) for name in present}


def on_meta():
    import torch

    return torch.device("meta")


def meta_transformer(setting):
    """The setting's SD3 transformer at full size on the meta device (its configs; nothing allocated)."""
    folder, _ = config_folder(setting, "full")
    return _components(folder, on_meta)["transformer"]


def build_phase(setting, cfg, scale: str) -> dict[str, Any]:
    """The ``build`` phase's numbers (nothing is allocated: every tensor lives on ``meta``)."""
    t0 = time.perf_counter()
    folder, source = config_folder(setting, scale)
    modules = _components(folder, on_meta)
    # buffers too (SD3's positional-embedding table is 0.23 B numbers): they take memory as weights do
    counts = {name: {"class": type(m).__name__, "parameters": sum(p.numel() for p in m.parameters()),
                     "buffers": sum(b.numel() for b in m.buffers()),
                     "on_meta": all(p.device.type == "meta" for p in m.parameters())} for name, m in modules.items()}
    lora, layers = lora_parameters(modules["transformer"], tuple(cfg.lora_targets), cfg.lora_rank) \
        if cfg.lora_rank > 0 else (counts["transformer"]["parameters"], 0)
    total = sum(c["parameters"] for c in counts.values())
    buffers = sum(c["buffers"] for c in counts.values())
    precision = setting.policy.precision or "no"
    encoders = sum(c["parameters"] + c["buffers"] for n, c in counts.items() if n.startswith("text_encoder"))
    chosen = setting.policy.offload_text_encoders
    compute = step_compute(modules["transformer"], setting.policy, cfg,
                           len(trained_steps(setting.policy.steps, cfg.train_fraction)))
    return {"seconds": round(time.perf_counter() - t0, 3), "configs": source, "components": counts, "compute": compute,
            "parameters_total": total, "buffers_total": buffers, "trainable": lora, "lora_rank": cfg.lora_rank,
            "lora_layers": layers, "precision": precision, "weights_bytes": (total + buffers) * BYTES.get(precision, 4),
            "text_encoder_bytes": encoders * BYTES.get(precision, 4),
            # the default rule of policy/pipeline.offload_by_default, in training (estimate and evaluate train nothing)
            "offload_text_encoders": {"setting": chosen, "train": encoders > lora if chosen is None else chosen},
            "rewards": rewards_build(setting, scale)}


# ------------------------------------------------------------------ random weights on the device


def random_pipeline(folder: Path | None, device, dtype, max_sequence_length: int):
    """The setting's ``StableDiffusion3Pipeline`` with random weights on ``device`` (in ``dtype``).

    Built with its parameters on ``meta`` (buffers on the CPU) and :func:`~recast_cli.preflight.phases.materialise`-d
    component by component, so a 7.9 B-parameter pipeline is never initialised on the CPU.
    Text goes through the offline word-level tokenizer of the toy model at the real lengths
    (CLIP's position table, 77 tokens in SD3.5; T5 padded to ``max_sequence_length``), also when
    the model folder has its own tokenizers: random weights need the shapes, not the language. The tiny scale is ``recast tiny-model``'s pipeline, materialised the same way.
    """
    from accelerate import init_empty_weights
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
    from diffusers.utils import logging as diffusers_logging

    from recast_cli.toy.model import word_tokenizer
    from recast_cli.toy.pretrain import toy_words

    def empty():
        return init_empty_weights(include_buffers=False)

    diffusers_logging.set_verbosity_error()  # its note on casting with .to(dtype) is noise here
    if folder is None:
        pipe = _tiny_pipeline(empty)
    else:
        words = toy_words()
        modules = _components(folder, empty)
        scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(folder, subfolder="scheduler",
                                                                    local_files_only=True)
        clip = modules["text_encoder"].config.max_position_embeddings  # 77 in SD3.5
        t5 = "text_encoder_3" in modules
        tokenizers = {"tokenizer": word_tokenizer(words, clip), "tokenizer_2": word_tokenizer(words, clip),
                      "tokenizer_3": word_tokenizer(words, max_sequence_length) if t5 else None}
        pipe = StableDiffusion3Pipeline(scheduler=scheduler, **tokenizers, **{"text_encoder_3": None, **modules})
    for seed, module in enumerate(_models(pipe).values()):
        materialise(module, device, dtype, seed)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ------------------------------------------------------------------ the command


def _device():
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _device_name(device) -> str:
    import torch

    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else device.type


def _phase_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def preflight(setting_name: str, out: Path, scale: str = "full", phases: str = ",".join(PHASES),
              random_weights: bool = True, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the phases, write ``out/preflight.json`` atomically, return its record.

    A phase that raises anything but BadInput is recorded with its one-line ``error`` and the
    others still run; ``progress(phase)`` is called as each phase starts.
    """
    import diffusers
    import torch

    from recast_cli.preflight.phases import host_rss_peak
    from recast_cli.setting.load import load_setting
    from recast_cli.train.config import config_from_setting

    if scale not in SCALES:
        raise BadInput(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if not random_weights:
        raise BadInput("recast preflight runs on random weights only (--random-weights); real weights are what it "
                       "checks for")
    chosen = parse_phases(phases)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: not a directory")
    claim_output(out / "preflight.json", PREFLIGHT_SCHEMA)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise BadInput("recast preflight runs in one process (engine single); run it without accelerate launch")
    setting = load_setting(setting_name)
    cfg = config_from_setting(setting)
    folder, _ = config_folder(setting, scale)
    running = [p for p in chosen if p != "build"]
    device = _device() if running else torch.device("meta")
    if running and scale == "full" and device.type != "cuda":
        raise BadInput(f"--phases {','.join(running)} at --scale full needs a CUDA device (none here); on the CPU "
                       "use --scale tiny, or --phases build")
    precision = (setting.policy.precision or "no") if device.type != "cpu" else "no"
    record: dict[str, Any] = {
        "schema": PREFLIGHT_SCHEMA, "recast_version": __version__, "torch": torch.__version__,
        "diffusers": diffusers.__version__, "setting": str(setting.file), "scale": scale,
        "device": _device_name(device), "dtype": {"no": "fp32"}.get(precision, precision), "engine": "single",
        "phases": {}}
    note = progress or (lambda phase: None)
    if "build" in chosen:
        note("build")
        record["phases"]["build"] = build_phase(setting, cfg, scale)
    if running:
        _run_phases(record, running, setting, cfg, folder, device, precision, scale, note)
    record["host_rss_peak_bytes"] = host_rss_peak()
    record["fits"] = _fits(record["phases"])
    atomic_write_bytes(out / "preflight.json", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return record


def _fits(phases: dict[str, Any]) -> bool | None:
    """Whether every phase that ran fit at the setting's batch sizes (None: none ran); the train step with
    the text encoders the other way than the setting's is shown, not required."""
    train = {k: v for k, v in phases.get("train", {}).items() if "offload" not in k}
    ran = [phases[k] for k in ("materialise", "estimate", "evaluate") if k in phases]
    ran += [phases["rewards"]] if "error" in phases.get("rewards", {}) else []
    ran += [train] if "error" in train else list(train.values())
    return all(r.get("fits", True) for r in ran) if ran else None


def _estimate_budget(setting) -> tuple[int, int, int, int, int | None]:
    """(T, N, K, rollout batch, P) of the setting's estimate: its ``[study]``, else ``recast estimate``'s defaults."""
    from recast_cli.estimate.config import EstimateConfig
    from recast_cli.study.spec import load_study

    defaults = EstimateConfig(policy="", rewards=())
    if not isinstance(setting.raw.get("study"), dict):
        return defaults.steps, defaults.N, defaults.K, defaults.batch_size, None
    study = load_study(setting)
    return study.estimate_steps, study.n, study.k, defaults.batch_size, study.p


def _run_phases(record, running, setting, cfg, folder, device, precision, scale, note) -> None:
    """Materialise the random pipeline, then run each phase; a failure is its phase's one-line ``error``."""
    import torch

    from recast_cli.policy.sd3 import PRECISIONS
    from recast_cli.preflight.phases import (STAND_IN, Bench, estimate_phase, evaluate_phase, measured,
                                             rewards_phase, train_phase)
    from recast_cli.preflight.rewards import placement, scorer_roles
    from recast_cli.toy.renderer import all_prompts

    roles = scorer_roles(setting)
    record["stand_ins"] = {"rewards": {r: STAND_IN for r in roles if placement(r)[0] != "model"},
                           "prompts": "the toy world's prompts (recast_cli.toy.renderer)"}
    made: dict[str, Any] = {}

    def materialised() -> dict[str, Any]:
        def work() -> dict[str, Any]:
            made["pipe"] = random_pipeline(folder, device, PRECISIONS[precision], setting.policy.max_sequence_length)
            return {"images": 0}

        out = measured(device, work)
        return {"init": INIT, **{k: v for k, v in out.items() if k not in ("images", "images_per_s")}}

    def run(phase: str, work: Callable[[], dict[str, Any]]) -> None:
        note(phase)
        try:
            record["phases"][phase] = work()
        except BadInput:
            raise
        except torch.cuda.OutOfMemoryError:  # outside a phase's batch, which is halved instead (fit)
            record["phases"][phase] = {"error": "CUDA out of memory before any batch ran (the weights and the "
                                                "phase's fixed state do not fit)", "fits": False}
        except Exception as exc:  # one line in the record; the other phases still run
            record["phases"][phase] = {"error": _phase_error(exc), "fits": False}

    run("materialise", materialised)
    if "pipe" not in made:
        return
    pipe = made["pipe"]
    record["parameters"] = {"total": sum(p.numel() for m in _models(pipe).values() for p in m.parameters()),
                            "trainable": lora_parameters(pipe.transformer, tuple(cfg.lora_targets), cfg.lora_rank)[0]
                            if cfg.lora_rank > 0 else sum(p.numel() for p in pipe.transformer.parameters())}
    bench = Bench(pipe, setting, device, precision, setting.policy.resolution if scale == "full" else None,
                  tuple(all_prompts()), scale)
    if "rewards" in running:
        run("rewards", lambda: rewards_phase(bench, tuple(roles)))
    if "estimate" in running:
        run("estimate", lambda: estimate_phase(bench, tuple(cfg.rewards), *_estimate_budget(setting)))
    if "train" in running:
        offload = bench.offload(record["parameters"]["trainable"])

        def train() -> dict[str, Any]:
            runs = {("compile" if c else "eager"): train_phase(bench, cfg, c, offload) for c in (False, True)}
            # the same eager step with the text encoders the other way: the peak with and without offload
            runs[f"eager, offload {'off' if offload else 'on'}"] = train_phase(bench, cfg, False, not offload)
            return runs

        run("train", train)
        record["engine"] = record["phases"]["train"].get("eager", {}).get("engine", "single")
    if "evaluate" in running:
        run("evaluate", lambda: evaluate_phase(bench))
