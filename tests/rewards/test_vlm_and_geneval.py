"""GenEval, UnifiedReward and the pairwise judge against fake loopback servers speaking their protocols."""

from __future__ import annotations

import base64
import io
import json
import pickle
import threading
import time

import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from recast_cli.cli import app
from recast_cli.errors import BadInput
from recast_cli.rewards import build_scorer
from recast_cli.rewards.judge import PairwiseJudge, Verdict, parse_verdicts, read_pairs, win_rates
from recast_cli.rewards.unifiedreward import parse_score
from tests.rewards.conftest import noise_images
from tests.rewards.fakes import fake_server, json_body, running

META = {"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"}


def chat_reply(text: str) -> bytes:
    return json_body({"choices": [{"message": {"role": "assistant", "content": text}}]})


def images_in(body: bytes) -> list[Image.Image]:
    """The images of an OpenAI-style chat request, decoded from their data URLs."""
    parts = json.loads(body)["messages"][0]["content"]
    return [Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1])))
            for p in parts if p["type"] == "image_url"]


# --------------------------------------------------------------------------- GenEval


def geneval_route(seen: list):
    def route(method, path, headers, body):
        request = json.loads(body)
        seen.append(request)
        n = len(request["images"])
        return 200, json_body({"scores": [0.25 * (i + 1) for i in range(n)], "rewards": [1.0] * n,
                               "strict_rewards": [0.0] * n, "group_rewards": {}, "group_strict_rewards": {}})
    return route


def test_geneval_sends_png_images_with_their_metadata_and_returns_the_scores(tmp_path):
    metadata = tmp_path / "evaluation_metadata.jsonl"
    metadata.write_text(json.dumps(META) + "\n")
    seen: list = []
    with running(fake_server(geneval_route(seen))) as url:
        scorer = build_scorer("geneval", url=url, metadata=metadata, batch_size=2)
        scores = scorer.score(noise_images(3), ["a photo of two cats", json.dumps(META), "a photo of two cats"])
    assert scores.tolist() == [0.25, 0.5, 0.25]
    assert [len(r["images"]) for r in seen] == [2, 1]
    assert seen[0]["meta_datas"] == [META, META] and seen[0]["only_strict"] is False
    sent = Image.open(io.BytesIO(base64.b64decode(seen[0]["images"][0])))
    assert sent.format == "PNG" and sent.tobytes() == noise_images(3)[0].tobytes()
    assert scorer.extras() == {"geneval_reward": [1.0] * 3, "geneval_strict_reward": [0.0] * 3}


def test_geneval_without_metadata_for_a_prompt_is_bad_input():
    with pytest.raises(BadInput, match="no GenEval metadata"):
        build_scorer("geneval", url="http://127.0.0.1:9").check_prompts(["a photo of two cats"])


def test_geneval_json_client_never_unpickles_a_reply():
    def route(method, path, headers, body):
        return 200, pickle.dumps({"scores": [1.0], "rewards": [1.0], "strict_rewards": [1.0]})

    with running(fake_server(route)) as url:
        with pytest.raises(BadInput, match="malformed reply"):
            build_scorer("geneval", url=url).score(noise_images(1), [json.dumps(META)])


def test_the_flow_grpo_pickle_protocol_is_opt_in_and_warns():
    seen = []

    def route(method, path, headers, body):
        request = pickle.loads(body)  # trusted-pickle: the fake server reads its own test client's request
        seen.append(request)
        n = len(request["images"])
        return 200, pickle.dumps({"scores": [0.75] * n, "rewards": [1.0] * n, "strict_rewards": [1.0] * n,
                                  "group_rewards": {}, "group_strict_rewards": {}})

    with running(fake_server(route)) as url:
        with pytest.warns(UserWarning, match="unpickles the server's replies"):
            scorer = build_scorer("geneval", url=url, protocol="flowgrpo-pickle", only_strict=True)
        assert scorer.score(noise_images(2), [json.dumps(META)] * 2).tolist() == [0.75, 0.75]
    assert seen[0]["only_strict"] is True and seen[0]["images"][0][:2] == b"\xff\xd8"  # JPEG, as Flow-GRPO sends


# --------------------------------------------------------------------------- UnifiedReward


@pytest.mark.parametrize(("reply", "value"), [
    ("The image matches well.\nFinal Score: 4", 4.0),
    ("**Final Score:** 3.5/5", 3.5),
    ("final score (1-5): 2 out of 5", 2.0),
    ("Alignment Score: 4\nCoherence Score: 3\nStyle Score: 5", 4.0),
    ("I cannot judge this image.", None),
])
def test_unifiedreward_parses_its_score_formats(reply, value):
    assert parse_score(reply) == value


def test_unifiedreward_scores_are_the_parsed_score_over_5_in_image_order():
    answers = {(255, 0, 0): "Final Score: 5", (0, 255, 0): "Final Score: 2.5", (0, 0, 255): "Final Score: 1"}

    def route(method, path, headers, body):
        assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer vlm-key"
        request = json.loads(body)
        assert request["temperature"] == 0 and "Text Caption: [a" in request["messages"][0]["content"][1]["text"]
        return 200, chat_reply(answers[images_in(body)[0].getpixel((0, 0))])

    images = [Image.new("RGB", (8, 8), c) for c in answers]
    with running(fake_server(route)) as url:
        scorer = build_scorer("unifiedreward", url=f"{url}/v1", api_key="vlm-key", concurrency=3)
        assert scorer.score(images, ["a red", "a green", "a blue"]).tolist() == [1.0, 0.5, 0.2]


@pytest.mark.parametrize(("status", "body", "needle"), [
    (200, chat_reply("I refuse."), "no 1-5 score in the reply for image 0"),
    (200, chat_reply("Final Score: 9"), "no 1-5 score"),
    (200, json_body({"id": "x"}), "without choices"),
    (401, json_body({"error": "bad key"}), "refused the API key"),
])
def test_unifiedreward_never_invents_a_score_for_a_bad_reply(status, body, needle):
    with running(fake_server(lambda *a: (status, body))) as url:
        with pytest.raises(BadInput, match=needle):
            build_scorer("unifiedreward", url=url, retries=1).score(noise_images(1), ["a"])


# --------------------------------------------------------------------------- pairwise judge


def test_judge_parses_json_and_line_verdicts():
    criteria = ("faithfulness", "aesthetics", "overall")
    assert parse_verdicts('Sure: {"faithfulness": "1", "aesthetics": "tie", "overall": 2}', criteria) == {
        "faithfulness": "1", "aesthetics": "tie", "overall": "2"}
    assert parse_verdicts("Faithfulness: Image 2\nAesthetics: first\nOverall: tie", criteria) == {
        "faithfulness": "2", "aesthetics": "1", "overall": "tie"}
    assert parse_verdicts('{"faithfulness": "1"}', criteria) is None


def test_win_rates_count_both_orders():
    verdicts = [
        Verdict(0, "ab", {"f": "a", "overall": "a"}, ""), Verdict(0, "ba", {"f": "a", "overall": "b"}, ""),
        Verdict(1, "ab", {"f": "tie", "overall": "a"}, ""), Verdict(1, "ba", {"f": "b", "overall": "b"}, ""),
    ]
    summary = win_rates(verdicts, ["f"])
    assert summary["f"]["win_rate_a"] == pytest.approx((2 + 0.5) / 4)
    assert summary["f"]["order_agreement"] == 0.5
    assert summary["overall"]["win_rate_a"] == 0.5
    assert summary["overall"]["first_position_share"] == 1.0


@pytest.fixture
def pairs_file(tmp_path):
    red, blue = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    rows = ["prompt,image_a,image_b"]
    for i in range(3):
        red.save(tmp_path / f"a{i}.png")
        blue.save(tmp_path / f"b{i}.png")
        rows.append(f"a red square,a{i}.png,b{i}.png")
    path = tmp_path / "pairs.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def first_is_red_route(always_first: bool):
    """A judge that prefers the red image on faithfulness, and the first shown on aesthetics (a position bias)."""
    def route(method, path, headers, body):
        first, _ = images_in(body)
        red_first = first.getpixel((0, 0)) == (255, 0, 0)
        faith = "1" if red_first else "2"
        return 200, chat_reply(json.dumps({"faithfulness": faith, "aesthetics": "1",
                                           "overall": "1" if always_first else faith}))
    return route


def test_the_judge_debiases_position_by_showing_both_orders(pairs_file):
    with running(fake_server(first_is_red_route(always_first=True))) as url:
        judge = PairwiseJudge(url, "judge-vlm", concurrency=2)
        verdicts = judge.judge_pairs(read_pairs(pairs_file))
    assert sorted((v.pair, v.order) for v in verdicts) == [(p, o) for p in range(3) for o in ("ab", "ba")]
    summary = win_rates(verdicts, judge.criteria)
    assert summary["faithfulness"]["win_rate_a"] == 1.0 and summary["faithfulness"]["order_agreement"] == 1.0
    assert summary["aesthetics"]["win_rate_a"] == 0.5 and summary["aesthetics"]["first_position_share"] == 1.0
    assert summary["overall"]["win_rate_a"] == 0.5


def test_recast_judge_writes_verdicts_and_win_rates(pairs_file, tmp_path):
    out = tmp_path / "J.parquet"
    with running(fake_server(first_is_red_route(always_first=False))) as url:
        result = CliRunner().invoke(app, ["judge", "--pairs", str(pairs_file), "--url", url, "--model", "m",
                                          "--out", str(out), "--label-a", "recast", "--label-b", "static"])
    assert result.exit_code == 0, result.stderr
    assert "recast vs static" in result.stdout
    table = pq.read_table(out)
    assert table.num_rows == 6 and set(table.column("faithfulness").to_pylist()) == {"a"}
    summary = json.loads(table.schema.metadata[b"summary"])
    assert summary["overall"]["win_rate_a"] == 1.0 and summary["aesthetics"]["win_rate_a"] == 0.5


def test_a_judge_reply_without_every_verdict_is_bad_input(pairs_file, tmp_path):
    with running(fake_server(lambda *a: (200, chat_reply("Both are nice.")))) as url:
        result = CliRunner().invoke(app, ["judge", "--pairs", str(pairs_file), "--url", url, "--model", "m",
                                          "--out", str(tmp_path / "J.parquet")])
    assert result.exit_code == 2 and "no verdict for every criterion" in result.stderr
    assert not (tmp_path / "J.parquet").exists()


# --------------------------------------------------------------------------- transport failures, every protocol


def slow_route(method, path, headers, body):
    time.sleep(1.0)
    return 200, b"{}"


@pytest.mark.parametrize("build", [
    lambda url: build_scorer("geneval", url=url, timeout=0.2, retries=2, backoff=0.0),
    lambda url: build_scorer("unifiedreward", url=url, timeout=0.2, retries=2, backoff=0.0),
])
def test_a_server_that_never_answers_in_time_is_unreachable_after_the_retries(build):
    with running(fake_server(slow_route)) as url:
        with pytest.raises(BadInput, match="unreachable after 2 tries \\(last: timed out\\)"):
            build(url).score(noise_images(1), [json.dumps(META)])


def test_a_geneval_server_that_dies_mid_batch_is_bad_input_after_the_retries():
    calls = []

    def route(method, path, headers, body):
        calls.append(1)
        if len(calls) == 1:
            return 200, json_body({"scores": [0.5], "rewards": [1.0], "strict_rewards": [1.0]})
        threading.Thread(target=lambda: (server.shutdown(), server.server_close()), daemon=True).start()
        return 0, b""

    server = fake_server(route)
    with running(server) as url:
        scorer = build_scorer("geneval", url=url, batch_size=1, timeout=2.0, retries=2, backoff=0.05)
        with pytest.raises(BadInput, match="unreachable after 2 tries"):
            scorer.score(noise_images(2), [json.dumps(META)] * 2)


def test_a_judge_endpoint_that_dies_is_bad_input_after_the_retries(pairs_file, tmp_path):
    def route(method, path, headers, body):
        threading.Thread(target=lambda: (server.shutdown(), server.server_close()), daemon=True).start()
        return 0, b""

    server = fake_server(route)
    with running(server) as url:
        judge = PairwiseJudge(url, "m", retries=2, backoff=0.05, timeout=2.0, concurrency=1)
        with pytest.raises(BadInput, match="unreachable after 2 tries"):
            judge.judge_pairs(read_pairs(pairs_file))
