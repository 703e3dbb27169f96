"""`make all SETTING=ocr` / `SETTING=geneval` end to end over tiny stand-ins of every model they name.

For each paper setting (pipelines/ocr.toml, pipelines/geneval.toml) a copy is written into a
tree laid out as the settings expect (pipelines/, models/, data/, the same ``../`` paths). The
copy keeps every table, reward, judge and λ list of the original, with

* every model path pointed at a tiny randomly initialised stand-in of the same architecture:
  the SD3.5-M folder → the toy world's tiny SD3 pipeline (SD3Transformer2DModel, AutoencoderKL,
  two CLIP text encoders and a T5 encoder, 32 x 32 images); ``clip``, ``pick`` (model and
  processor) and ``aesthetic``'s backbone → copies of one tiny transformers CLIPModel folder
  (the processor folder with a ``preprocessor_config.json``, as the laion repo has); ``hps`` →
  a tiny open_clip model saved as HPS_v2.1_compressed.pt (its JSON config given as ``arch``);
  ``aesthetic``'s head → a LAION aesthetic MLP over the tiny CLIP's 16-d features;
* ``ocr``: the real PP-OCRv4 ONNX models that ship in rapidocr-onnxruntime (no weights to
  substitute);
* the servers (``url`` options) pointed at fakes on loopback, in this process, that speak the
  real protocols and score from pixel statistics so scores vary: ``geneval`` → a GenEval
  server (JSON protocol), ``unifiedreward`` → an OpenAI-compatible chat endpoint;
* the judges ``imagereward`` and ``hpsv3``, whose packages cannot import beside transformers 5
  (docs/rewards.md: they run in side package sets behind ``recast serve-reward``), served the
  way the real settings would use them from recast's own environment: ``NAME@URL`` remote
  scorers, here backed by fake ``recast.reward/1`` servers. Their ``[rewards.NAME]`` weight
  tables are dropped (the weights live with the server);
* ``device = "cpu"`` wherever the original says ``cuda``, ``precision = "no"`` (fp32) for the
  policy, and budgets shrunk to minutes: T = 4 at 32 px, one warmup step, two training steps,
  G = 2 x 2 prompts, one budget x one seed x {static, recast}, an estimate with T = 5 (so W is
  resampled to the 4-step training grid, as the paper's 25 → 10), N = 2, K = 1, P = 2;
* positives: the paper's ``openai`` source needs the network; the ocr copy uses
  ``folder:`` (PNGs of the quoted text written here) and the geneval copy ``self`` (SIR from
  the policy, one positive set per reward, ``[positives] rewards``), both offline.

``recast check-setting`` must pass on each copy; then the study's Make graph
(``recast study-makefile`` + ``make -f``, what ``make all SETTING=S`` runs) must run to the
report, which names all four training rewards and the judges, and resume after a kill doing only
what was left (the image route's one end-to-end run: tests/test_study.py checks the graph's text). To keep CI inside its time, only the
ocr copy runs end to end; the geneval copy's graph is checked with ``make -n`` (its own pieces, the
``self`` positives and the GenEval server protocol, have tests of their own: tests/positives/test_sir.py,
tests/rewards/).
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.rewards.options import reward_path_options
from tests.rewards import tiny_models
from tests.rewards.fakes import fake_server, json_body, running

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"
BIN = Path(sys.executable).parent
runner = CliRunner()

OCR_TRAIN = ['A shop sign that reads "OPEN"', 'A poster with the words "Hello World"',
             'A coffee mug printed with "coffee"', 'A red street sign saying "STOP"']
OCR_TEST = ['A neon sign that reads "BAR"', 'A book cover titled "Recast"']
GENEVAL_TRAIN = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
    {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}],
     "prompt": "a photo of a cat and a dog"},
    {"tag": "counting", "include": [{"class": "apple", "count": 3}], "exclude": [{"class": "apple", "count": 4}],
     "prompt": "a photo of three apples"},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a photo of a red car"},
]
GENEVAL_TEST = [
    {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"},
    {"tag": "position", "include": [{"class": "cat", "count": 1}, {"class": "car", "count": 1, "position":
                                     ["left of", 0]}], "prompt": "a photo of a car left of a cat"},
]
#: what each paper setting's study is shrunk to (the λ lists stay the paper's 4-reward budgets)
STUDY = {"budgets": [[1, 1, 1, 2]], "seeds": [0], "modes": ["static", "recast"], "warmup_steps": 1,
         "estimate_steps": 5, "n": 2, "k": 1, "p": 2}
TRAIN = {"max_steps": 2, "group_size": 2, "prompts_per_step": 2, "micro_batch": 4, "sample_batch": 4,
         "lora_rank": 2, "lora_alpha": 4, "save_every": 2}
POLICY = {"path": "../models/stable-diffusion-3.5-medium", "steps": 4, "resolution": 32, "precision": "no"}
EVALUATE = {"n": 1, "steps": 4, "batch_size": 4}
#: judges whose packages need transformers 4.x: served by `recast serve-reward` in a side package set
REMOTE_JUDGES = ("imagereward", "hpsv3")


# --------------------------------------------------------------------------- fake servers


def _pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.float64) / 255


class Fakes:
    """Loopback fakes of every server the paper settings name; ``calls[name]`` counts the images each scored."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {"geneval": 0, "unifiedreward": 0, **{j: 0 for j in REMOTE_JUDGES}}
        self.urls: dict[str, str] = {}

    def geneval(self, method, path, headers, body):
        if method == "GET":  # `recast check-setting` asks whether the server answers: 404, as a real one would
            return 404, json_body({"detail": "Not Found"})
        request = json.loads(body)
        assert len(request["images"]) == len(request["meta_datas"]) and request["only_strict"] is True
        assert all("tag" in m and "include" in m for m in request["meta_datas"])
        self.calls["geneval"] += len(request["images"])
        scores = [float(_pixels(im).mean()) for im in request["images"]]
        hits = [float(s > 0.5) for s in scores]
        return 200, json_body({"scores": scores, "rewards": hits, "strict_rewards": hits, "group_rewards": {},
                               "group_strict_rewards": {}})

    def unifiedreward(self, method, path, headers, body):
        if method == "GET":  # check-setting and serve-judges ask whether it answers and serves the judge's model
            if path == "/v1/models":
                return 200, json_body({"object": "list", "data": [{"id": "UnifiedReward-2.0-qwen-7b"}]})
            return 404, json_body({"detail": "Not Found"})
        assert method == "POST" and path == "/v1/chat/completions", path
        parts = json.loads(body)["messages"][0]["content"]
        image = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url").split(",", 1)[1]
        self.calls["unifiedreward"] += 1
        score = 1 + 4 * min(4 * float(_pixels(image).std()), 1.0)  # in [1, 5], as UnifiedReward-2 scores
        reply = f"The image roughly follows the caption.\nFinal Score: {score:.2f}"
        return 200, json_body({"choices": [{"message": {"role": "assistant", "content": reply}}]})

    def remote(self, name: str):
        def route(method, path, headers, body):
            if method == "GET" and path == "/v1/info":
                return 200, json_body({"protocol": "recast.reward/1", "scorer": name, "output_range": [None, None]})
            assert method == "POST" and path == "/v1/score", path
            request = json.loads(body)
            self.calls[name] += len(request["images"])
            pixels = [_pixels(im) for im in request["images"]]
            scores = [float(p.mean() - p.std()) if name == "imagereward" else float(p[..., 0].mean()) for p in pixels]
            return 200, json_body({"scores": scores, "extras": {}})
        return route


@pytest.fixture(scope="module")
def fakes():
    import contextlib

    state = Fakes()
    with contextlib.ExitStack() as stack:
        state.urls["geneval"] = stack.enter_context(running(fake_server(state.geneval)))
        state.urls["unifiedreward"] = stack.enter_context(running(fake_server(state.unifiedreward))) + "/v1"
        for judge in REMOTE_JUDGES:
            state.urls[judge] = stack.enter_context(running(fake_server(state.remote(judge))))
        yield state


# --------------------------------------------------------------------------- the stand-in tree


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _text_png(text: str, path: Path, seed: int) -> None:
    """Black text on a lightly tinted square: an offline π⁺ surrogate of an OCR prompt."""
    tint = tuple(int(v) for v in np.random.default_rng(seed).integers(200, 256, 3))
    image = Image.new("RGB", (96, 96), tint)
    ImageDraw.Draw(image).text((4, 36), text, fill="black", font=ImageFont.load_default(size=18))
    image.save(path)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """models/ (tiny stand-ins) and data/ (Flow-GRPO-format prompt files), as the settings lay them out."""
    from recast_cli.toy.model import build_pipeline, save_pipeline

    root = tmp_path_factory.mktemp("paper-study")
    (root / "pipelines").mkdir()
    ocr, geneval, models = root / "data" / "ocr", root / "data" / "geneval", root / "models"
    for folder in (ocr, geneval, models):
        folder.mkdir(parents=True)
    (ocr / "train.txt").write_text("\n".join(OCR_TRAIN) + "\n")
    (ocr / "test.txt").write_text("\n".join(OCR_TEST) + "\n")
    (ocr / "estimate.txt").write_text("\n".join(OCR_TRAIN[:2]) + "\n")
    _write_jsonl(geneval / "train_metadata.jsonl", GENEVAL_TRAIN)
    _write_jsonl(geneval / "test_metadata.jsonl", GENEVAL_TEST)
    _write_jsonl(geneval / "metadata.jsonl", GENEVAL_TRAIN + GENEVAL_TEST)
    (geneval / "estimate.txt").write_text("".join(row["prompt"] + "\n" for row in GENEVAL_TRAIN[:2]))
    # π⁺ surrogates for the ocr copy's folder: source (the paper asks GPT Image 1.5; no network here)
    positives = root / "positives-ocr"
    positives.mkdir()
    index = []
    for p, prompt in enumerate(OCR_TRAIN[:2]):
        text = re.search(r'"([^"]+)"', prompt).group(1)
        for s in range(STUDY["n"]):
            _text_png(text, positives / f"p{p}-{s}.png", seed=10 * p + s)
            index.append({"file_name": f"p{p}-{s}.png", "prompt": prompt})
    _write_jsonl(positives / "metadata.jsonl", index)
    # the policy: a tiny SD3-architecture pipeline (with T5) whose word vocabulary covers the prompts
    texts = OCR_TRAIN + OCR_TEST + [row["prompt"] for row in GENEVAL_TRAIN + GENEVAL_TEST]
    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]+", t.lower())})
    save_pipeline(build_pipeline(words, with_t5=True), models / "stable-diffusion-3.5-medium")
    # reward models: one tiny transformers CLIP, laid out as the three CLIP folders the settings name
    clip = tiny_models.save_tiny_clip(models / "clip-vit-large-patch14")
    shutil.copytree(clip, models / "PickScore_v1")
    processor = shutil.copytree(clip, models / "CLIP-ViT-H-14-laion2B-s32B-b79K")
    # transformers 5 saves a CLIPProcessor as processor_config.json only; the laion repo (and
    # check-setting's marker for pick's processor) has the image processor's preprocessor_config.json
    from transformers import CLIPImageProcessor

    CLIPImageProcessor.from_pretrained(processor).save_pretrained(processor)
    hps = models / "HPSv2"
    hps.mkdir()
    tiny_models.save_tiny_hps(hps)
    aesthetic = models / "aesthetic"
    aesthetic.mkdir()
    tiny_models.save_tiny_aesthetic_head(aesthetic)
    return root


#: [rewards.NAME] of the copies: every model path the paper settings name, pointed at a stand-in
def _reward_tables(tree: Path, urls: dict[str, str]) -> dict[str, dict[str, Any]]:
    clip = "../models/clip-vit-large-patch14"
    # hps's arch: an open_clip model name or a JSON config file; not a path option that a setting
    # resolves against its folder (rewards.options.reward_path_options), hence absolute
    arch = str(tree / "models" / "HPSv2" / f"{tiny_models.HPS_ARCH}.json")
    return {
        "clip": {"weights": clip, "device": "cpu"},
        "hps": {"weights": "../models/HPSv2/HPS_v2.1_compressed.pt", "arch": arch, "device": "cpu"},
        "pick": {"weights": "../models/PickScore_v1", "processor": "../models/CLIP-ViT-H-14-laion2B-s32B-b79K",
                 "device": "cpu"},
        "ocr": {"backend": "rapidocr"},
        "geneval": {"url": urls["geneval"], "metadata": "../data/geneval/metadata.jsonl", "only_strict": True},
        "aesthetic": {"weights": "../models/aesthetic/sac+logos+ava1-l14-linearMSE.pth", "clip": clip,
                      "device": "cpu"},
        "unifiedreward": {"url": urls["unifiedreward"], "model": "UnifiedReward-2.0-qwen-7b"},
    }


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def _dump_toml(data: dict[str, Any]) -> str:
    lines: list[str] = []

    def table(name: str, values: dict[str, Any]) -> None:
        plain = {k: v for k, v in values.items() if not isinstance(v, dict)}
        if plain:
            lines.append(f"[{name}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in plain.items())
            lines.append("")
        for key, sub in values.items():
            if isinstance(sub, dict):
                table(f"{name}.{key}", sub)

    for name, values in data.items():
        table(name, values)
    return "\n".join(lines)


def paper_copy(tree: Path, fakes: Fakes, name: str) -> Path:
    """pipelines/NAME.toml of the stand-in tree: the paper setting with every model and budget substituted."""
    original = tomllib.loads((PIPELINES / f"{name}.toml").read_text())
    data = json.loads(json.dumps(original))  # a deep copy
    tables = _reward_tables(tree, fakes.urls)
    # every reward and judge of the original is substituted: a local stand-in or a remote scorer
    assert set(original["rewards"]) == set(tables) - {"ocr" if name == "geneval" else "geneval"} | set(REMOTE_JUDGES)
    for reward, options in original["rewards"].items():
        if reward in REMOTE_JUDGES:
            continue
        paths = reward_path_options(reward) & set(options)
        assert paths <= set(tables[reward]), (reward, paths)
    data["rewards"] = {r: tables[r] for r in original["rewards"] if r not in REMOTE_JUDGES}
    for reward, options in data["rewards"].items():  # ... and every path of the copy lies in the stand-in tree
        for option in reward_path_options(reward) & set(options):
            assert (tree / "pipelines" / options[option]).resolve().is_relative_to(tree), (reward, option)
    judges = original["evaluate"]["judges"]
    data["evaluate"]["judges"] = [f"{j}@{fakes.urls[j]}" if j in REMOTE_JUDGES else j for j in judges] + [SIDE_JUDGE]
    data["policy"].update(POLICY)
    data["train"].update(TRAIN)
    data["study"].update(STUDY)
    data["evaluate"].update(EVALUATE)
    assert data["study"]["positives"] == "openai"  # the paper's source: an image API, offline here
    if name == "ocr":
        data["study"]["positives"] = "folder:../positives-ocr"
    else:
        data["study"]["positives"] = "self"
        data["positives"]["rewards"] = original["train"]["rewards"]
    path = tree / "pipelines" / f"{name}.toml"
    path.write_text(f"# {name}.toml over tiny stand-ins (tests/test_study_paper_settings.py)\n\n" + _dump_toml(data))
    return path


# --------------------------------------------------------------------------- the test


#: a held-out judge whose package is not in recast's environment (as hpsv3's is not on a bare node): a plug-in
#: scorer (module:Class) that imports ``recast_side_pkg``, which only ``side/`` holds
SIDE_JUDGE = "side_judge:SideJudge"
SIDE_JUDGE_CODE = '''"""A judge whose package lives in a side environment (tests/test_study_paper_settings.py)."""
import numpy as np

from recast_cli.rewards.base import Scorer


class SideJudge(Scorer):
    name = "side_judge"
    requires = ("recast_side_pkg",)
    provided_by = "make judges with its side environment on PYTHONPATH"

    def __init__(self):
        import recast_side_pkg

        self.brightness = recast_side_pkg.brightness

    def score(self, images, prompts):
        return np.array([self.brightness(im) for im in images], dtype=np.float64)
'''


def write_side_judge(tree: Path) -> tuple[Path, Path]:
    """(the plug-in's folder, the side environment's folder)."""
    plugins, side = tree / "plugins", tree / "side" / "recast_side_pkg"
    plugins.mkdir(exist_ok=True)
    side.mkdir(parents=True, exist_ok=True)
    (plugins / "side_judge.py").write_text(SIDE_JUDGE_CODE)
    (side / "__init__.py").write_text("import numpy as np\n\n\ndef brightness(image):\n"
                                      "    return float(np.asarray(image, dtype=np.float64).mean() / 255)\n")
    return plugins, side.parent


def _run(args: list[str], cwd: Path, timeout: int, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HOME": str(cwd),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(cwd / "hf-cache"),
           **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    return subprocess.run(args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("name", ["ocr", "geneval"])
def test_paper_study_runs_end_to_end_over_tiny_standins(tree, fakes, name, monkeypatch):
    plugins, side = write_side_judge(tree)
    monkeypatch.syspath_prepend(str(plugins))
    setting = paper_copy(tree, fakes, name)
    check = runner.invoke(app, ["check-setting", str(setting)])
    assert check.exit_code == 0, check.stderr
    assert "checks passed" in check.stdout
    shown = " ".join(check.stdout.split())
    # the judge whose package is missing is listed, with what provides it; it does not fail the check
    assert f"judge {SIDE_JUDGE}: package recast_side_pkg does not import here" in shown, shown
    assert "make judges" in shown
    rewards = tomllib.loads(setting.read_text())["train"]["rewards"]
    assert rewards == ["clip", "hps", "pick", name]

    root = tree / f"study-{name}"
    graph = _run([str(BIN / "recast"), "study-makefile", "--setting", str(setting), "--root", str(root),
                  "--recast", str(BIN / "recast")], tree, 120)
    assert graph.returncode == 0, graph.stderr
    mk = tree / f"{name}.mk"
    mk.write_text(graph.stdout)
    solves = [line for line in graph.stdout.splitlines() if " solve-w " in line]
    assert solves and all(" --kernel exp " in line for line in solves)  # the plan's kernel, passed on
    if name == "geneval":  # its graph, checked without running it: the run end to end is ocr's (CI time)
        planned = _run(["make", "-f", str(mk), "-n", "all"], tree, 120)
        assert planned.returncode == 0, planned.stderr[-3000:]
        commands = {line.split()[1] for line in planned.stdout.splitlines() if line.startswith(str(BIN / "recast"))}
        assert {"sample-positive", "estimate", "solve-w", "train", "evaluate", "report"} <= commands, commands
        assert f"--setting {setting}" in planned.stdout or str(setting) in planned.stdout
        return
    before = dict(fakes.calls)
    made = _run(["make", "-f", str(mk), "-j", "2", "all"], tree, 900, str(plugins))  # `make all JOBS=2`
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert "train step 2/2" in made.stderr  # one progress line per step and run (--progress lines)

    report = root / "report" / "report.md"
    assert report.is_file()
    assert f"Training rewards: {', '.join(rewards)}; held-out judges: none." in report.read_text()
    for run in ("static-s0", "recast-s0"):
        assert (root / "runs" / "1-1-1-2" / run / ".done").is_file()
        assert (root / "evals" / "1-1-1-2" / f"{run}.parquet").is_file()
    import pyarrow.parquet as pq

    tables = ("base", "1-1-1-2/static-s0", "1-1-1-2/recast-s0")
    # `make all` trained and evaluated without any judge: training never waits on one
    for table in tables:
        rows = pq.read_table(root / "evals" / f"{table}.parquet", columns=["kind", "scorer"]).to_pylist()
        assert {(r["kind"], r["scorer"]) for r in rows} == {("reward", r) for r in rewards}, table
    assert all(fakes.calls[j] == before[j] for j in (*REMOTE_JUDGES, "unifiedreward"))

    # `make judges` (the top Makefile's target: the graph's judges inside `recast serve-judges`, which finds
    # the unifiedreward server answering with its model and starts none), once the side judge's environment
    # is there, adds every judge to every evaluation
    judged = _run(["make", "-C", str(ROOT), "judges", f"SETTING={setting}", f"STUDY={root}",
                   f"JUDGES_ENV=PYTHONPATH={plugins}:{side}"], tree, 900)
    assert judged.returncode == 0, judged.stdout[-3000:] + judged.stderr[-3000:]
    judges = tomllib.loads((PIPELINES / f"{name}.toml").read_text())["evaluate"]["judges"] + [SIDE_JUDGE]
    assert f"Training rewards: {', '.join(rewards)}; held-out judges: {', '.join(judges)}." in report.read_text()
    # every evaluation scored every training reward and judge (remote judges under their own names)
    for table in tables:
        rows = pq.read_table(root / "evals" / f"{table}.parquet", columns=["kind", "scorer", "score"]).to_pylist()
        assert {(r["kind"], r["scorer"]) for r in rows} == {("reward", r) for r in rewards} | {
            ("judge", j) for j in judges}, table
        assert all(np.isfinite(r["score"]) for r in rows)
    assert "--add-judges" not in _run(["make", "-f", str(mk), "-n", "judges"], tree, 120).stdout  # all judged
    # every server was asked, through its protocol: geneval (a training reward of one setting) and the judges
    used = {k: fakes.calls[k] - before[k] for k in fakes.calls}
    assert used["unifiedreward"] > 0 and all(used[j] > 0 for j in REMOTE_JUDGES), used
    assert used["geneval"] == 0, used  # ocr trains no geneval reward
    _resumes_only_what_a_kill_left_undone(mk, tree, root, str(plugins))


def _resumes_only_what_a_kill_left_undone(mk: Path, tree: Path, root: Path, plugins: str) -> None:
    """Nothing is left to do; then, as a kill mid-way would leave it, the ReCAST run's stamp and its
    evaluation are gone: a second make redoes only them, its D estimate (Table 6) and the report."""
    again = _run(["make", "-f", str(mk), "--question", "all"], tree, 120, plugins)
    assert again.returncode == 0, again.stdout
    gains = (root / "gains.parquet").stat().st_mtime_ns
    static = (root / "evals" / "1-1-1-2" / "static-s0.parquet").stat().st_mtime_ns
    (root / "runs" / "1-1-1-2" / "recast-s0" / ".done").unlink()
    (root / "evals" / "1-1-1-2" / "recast-s0.parquet").unlink()
    resumed = _run(["make", "-f", str(mk), "-j", "2", "all"], tree, 900, plugins)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    recipes = [line for line in resumed.stdout.splitlines() if " --out " in line]
    redone = sorted(line.split(" --out ")[1].split()[0].rsplit("/", 3)[-1] for line in recipes)
    assert redone == ["1-1-1-2-recast-s0.parquet", "recast-s0", "recast-s0.parquet", "report"], redone
    assert (root / "gains.parquet").stat().st_mtime_ns == gains
    assert (root / "evals" / "1-1-1-2" / "static-s0.parquet").stat().st_mtime_ns == static
    # the evaluation redone has no judges yet: `make judges` would judge it (and only it) again
    stale = _run(["make", "-f", str(mk), "-n", "judges"], tree, 120)
    assert stale.stdout.count("--add-judges") == 1 and "recast-s0.parquet --quiet" in stale.stdout, stale.stdout
