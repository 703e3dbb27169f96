"""openai and gemini sources against scripted loopback servers that speak their protocols."""

from __future__ import annotations

import pytest
from PIL import Image

from recast_cli.artifacts import read_positives
from recast_cli.positives.collect import JOURNAL_NAME
from tests.positives.common import assert_one_line_exit_2, prompts_file, recast
from tests.positives.fakes import GEMINI, KEY, OPENAI, Flavour, Reply, png, serve

FLAVOURS = pytest.mark.parametrize("flavour", [OPENAI, GEMINI], ids=lambda f: f.source)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def run(flavour: Flavour, url: str, monkeypatch, tmp_path, *extra: object, prompts=None):
    for name, value in flavour.env(url).items():
        monkeypatch.setenv(name, value)
    args = ["sample-positive", "--prompts", prompts or prompts_file(tmp_path), "--source", flavour.source,
            "--resolution", 32, "--out", tmp_path / "out", "--backoff", 0.01, "--concurrency", 2, *extra]
    if "--n" not in extra:
        args += ["--n", 2]
    return recast(*args)


@FLAVOURS
def test_api_images_are_normalised_and_the_key_is_never_written(flavour, monkeypatch, tmp_path):
    with serve(lambda i, seen: flavour.image(png())) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path)
    assert result.exit_code == 0, result.stderr
    positives = read_positives(tmp_path / "out")
    assert len(positives.samples) == 4 and {s.source for s in positives.samples} == {flavour.source}
    assert all(s.seed == -1 for s in positives.samples)
    with Image.open(tmp_path / "out" / positives.samples[0].image_path) as image:
        assert image.size == (32, 32) and image.mode == "RGB"
    assert len(seen) == 4
    if flavour is OPENAI:
        assert {s.body["model"] for s in seen} == {"gpt-image-1.5"}
        assert seen[0].headers["authorization"] == f"Bearer {KEY}"
    else:
        assert seen[0].path.endswith("/models/gemini-3-pro-image-preview:generateContent")
        assert seen[0].headers["x-goog-api-key"] == KEY
    written = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert KEY.encode() not in written and KEY not in result.stdout + result.stderr


@FLAVOURS
def test_rate_limit_is_retried_with_backoff(flavour, monkeypatch, tmp_path):
    def script(i, seen):
        return Reply(**{**flavour.rate_limited.__dict__, "headers": {"Retry-After": "0"}}) if i == 0 else \
            flavour.image(png())

    with serve(script) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path, "--n", 1, prompts=prompts_file(tmp_path, ["one prompt"]))
    assert result.exit_code == 0, result.stderr
    assert len(seen) == 2 and len(read_positives(tmp_path / "out").samples) == 1


@FLAVOURS
def test_truncated_answer_is_retried(flavour, monkeypatch, tmp_path):
    def script(i, seen):
        return Reply(**{**flavour.image(png()).__dict__, "truncate": True}) if i == 0 else flavour.image(png())

    with serve(script) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path, "--n", 1, prompts=prompts_file(tmp_path, ["one prompt"]))
    assert result.exit_code == 0, result.stderr
    assert len(seen) == 2 and len(read_positives(tmp_path / "out").samples) == 1


@FLAVOURS
def test_server_errors_until_retries_run_out_leave_a_resumable_journal(flavour, monkeypatch, tmp_path):
    prompts = prompts_file(tmp_path, ["p0", "p1"])

    def failing(i, seen):  # prompt p1 always fails, p0 works
        return flavour.server_error if "p1" in str(seen.body) else flavour.image(png())

    with serve(failing) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path, "--retries", 2, "--n", 1, prompts=prompts)
    assert result.exit_code == 1 and "1 image(s) failed" in result.stderr and "rerun" in result.stderr
    assert "Traceback" not in result.stderr
    assert sum("p1" in str(s.body) for s in seen) == 3  # one try and two retries
    assert not (tmp_path / "out" / "manifest.parquet").exists() and (tmp_path / "out" / JOURNAL_NAME).exists()

    with serve(lambda i, seen: flavour.image(png(color=(0, 0, 200)))) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path, "--n", 1, prompts=prompts)
    assert result.exit_code == 0, result.stderr
    assert [s.body for s in seen] and all("p1" in str(s.body) for s in seen)  # only the failed image is asked again
    positives = read_positives(tmp_path / "out")
    assert [s.prompt for s in positives.samples] == ["p0", "p1"]
    assert not (tmp_path / "out" / JOURNAL_NAME).exists()


@FLAVOURS
def test_refusal_is_recorded_per_prompt_and_skipped(flavour, monkeypatch, tmp_path):
    prompts = prompts_file(tmp_path, ["fine prompt", "forbidden prompt"])

    def script(i, seen):
        return flavour.refusal if "forbidden" in str(seen.body) else flavour.image(png())

    with serve(script) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path, "--concurrency", 1, prompts=prompts)
    assert result.exit_code == 0, result.stderr
    positives = read_positives(tmp_path / "out")
    assert positives.prompts() == ["fine prompt"] and len(positives.samples) == 2
    [refusal] = positives.meta["refused"]
    assert refusal["prompt"] == "forbidden prompt" and refusal["prompt_id"] == 1
    assert sum("forbidden" in str(s.body) for s in seen) == 1  # the prompt's second image is not asked


@FLAVOURS
def test_missing_key_names_the_variable_and_writes_nothing(flavour, tmp_path):
    result = recast("sample-positive", "--prompts", prompts_file(tmp_path), "--source", flavour.source,
                    "--resolution", 32, "--n", 1, "--out", tmp_path / "out")
    assert_one_line_exit_2(result, "OPENAI_API_KEY" if flavour is OPENAI else "GEMINI_API_KEY")
    assert not (tmp_path / "out").exists()


@FLAVOURS
def test_rejected_key_stops_with_one_line_and_leaves_nothing(flavour, monkeypatch, tmp_path):
    if flavour is OPENAI:
        reply = Reply(401, {"error": {"code": "invalid_api_key", "message": f"Incorrect API key provided: {KEY}",
                                      "type": "invalid_request_error", "param": None}})
    else:
        reply = Reply(401, {"error": {"code": 401, "message": f"API key {KEY} not valid", "status": "UNAUTHENTICATED"}})
    with serve(lambda i, seen: reply) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path, "--n", 1)
    assert_one_line_exit_2(result, "401")
    assert KEY not in result.stderr and "***" in result.stderr
    assert not (tmp_path / "out").exists()


@FLAVOURS
def test_at_most_concurrency_requests_are_in_flight(flavour, monkeypatch, tmp_path):
    import threading
    import time

    lock, state = threading.Lock(), {"now": 0, "peak": 0}

    def slow(i, seen):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.1)
        with lock:
            state["now"] -= 1
        return flavour.image(png())

    with serve(slow) as (url, seen):
        result = run(flavour, url, monkeypatch, tmp_path, "--n", 3, "--concurrency", 2)
    assert result.exit_code == 0, result.stderr
    assert len(seen) == 6 and state["peak"] == 2
