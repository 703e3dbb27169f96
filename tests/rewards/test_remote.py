"""`recast.reward/1`: the reward server and its client, on loopback, with real and misbehaving servers."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

from recast_cli.errors import BadInput
from recast_cli.rewards import build_scorer
from recast_cli.rewards.remote import PROTOCOL
from recast_cli.rewards.server import make_server, serve
from recast_cli.rewards.transport import Endpoint, png_base64, request
from tests.rewards.conftest import noise_images, text_image
from tests.rewards.fakes import fake_server, json_body, running

TOKEN = "s3cret-token-value"
INFO = {"protocol": PROTOCOL, "scorer": "clip", "output_range": [-1.0, 1.0]}


@pytest.fixture(scope="module")
def clip_scorer(tiny_clip_dir):
    return build_scorer("clip", weights=tiny_clip_dir)


@pytest.fixture
def clip_server(clip_scorer):
    with running(make_server(clip_scorer, token=TOKEN)) as url:
        yield url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_scores_equal_local_scores_across_batches(clip_server, clip_scorer):
    images, prompts = noise_images(5), [f"prompt {i}" for i in range(5)]
    remote = build_scorer(f"clip@{clip_server}", token=TOKEN, batch_size=2)
    assert remote.name == "clip"
    assert remote.output_range == pytest.approx(clip_scorer.output_range)
    np.testing.assert_allclose(remote.score(images, prompts), clip_scorer.score(images, prompts), rtol=1e-5)


def test_the_token_comes_from_the_environment_when_not_given(clip_server, monkeypatch):
    monkeypatch.setenv("RECAST_REWARD_TOKEN", TOKEN)
    assert build_scorer(f"clip@{clip_server}").score(noise_images(1), ["a"]).shape == (1,)


def test_remote_ocr_brings_back_the_text_it_read():
    with running(make_server(build_scorer("ocr"))) as url:
        remote = build_scorer(f"ocr@{url}")
        scores = remote.score([text_image("RECAST")], ['a logo "recast"'])
    assert scores[0] == 1.0
    assert remote.extras() == {"ocr_text": ["RECAST"]}


@pytest.mark.parametrize("token", ["wrong-token", None])
def test_a_wrong_or_missing_token_is_bad_input_that_does_not_leak_tokens(clip_server, monkeypatch, token):
    monkeypatch.delenv("RECAST_REWARD_TOKEN", raising=False)
    with pytest.raises(BadInput, match="refused the token") as caught:
        build_scorer(f"clip@{clip_server}", token=token, retries=1)
    assert TOKEN not in str(caught.value) and "wrong-token" not in str(caught.value)


def test_the_server_refuses_a_score_request_with_a_wrong_token(clip_server):
    body = json.dumps({"prompts": ["a"], "images": [png_base64(noise_images(1)[0])]}).encode()
    reply = request(Endpoint(clip_server), "POST", "/v1/score", "test", body,
                    {"Authorization": "Bearer nope", "Content-Type": "application/json"})
    assert reply.status == 401


def test_the_client_checks_which_scorer_the_server_serves(clip_server):
    with pytest.raises(BadInput, match="serves 'clip', not 'pick'"):
        build_scorer(f"pick@{clip_server}", token=TOKEN)


def test_the_server_rejects_images_that_are_not_png_and_unpaired_prompts(clip_server):
    remote = build_scorer(f"clip@{clip_server}", token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    jpeg = json.dumps({"prompts": ["a"], "images": ["/9j/4AAQSkZJRg=="]}).encode()
    reply = request(remote.endpoint, "POST", "/v1/score", "test", jpeg, headers)
    assert reply.status == 400 and "not base64-encoded PNG" in reply.json("test")["error"]
    unpaired = json.dumps({"prompts": ["a"], "images": [png_base64(im) for im in noise_images(2)]}).encode()
    reply = request(remote.endpoint, "POST", "/v1/score", "test", unpaired, headers)
    assert reply.status == 400 and "2 images but 1 prompts" in reply.json("test")["error"]


def test_a_server_that_never_answers_in_time_is_unreachable_after_the_retries():
    def route(method, path, headers, body):
        if path == "/v1/info":
            return 200, json_body(INFO)
        time.sleep(1.0)
        return 200, json_body({"scores": [0.0]})

    with running(fake_server(route)) as url:
        remote = build_scorer(f"clip@{url}", timeout=0.2, retries=2, backoff=0.0)
        started = time.perf_counter()
        with pytest.raises(BadInput, match="unreachable after 2 tries \\(last: timed out\\)"):
            remote.score(noise_images(1), ["a"])
        assert time.perf_counter() - started < 1.5


@pytest.mark.parametrize(("reply", "needle"), [
    (b"<html>oops</html>", "malformed reply \\(not JSON"),
    (json_body({"scores": [0.1]}), "expected 2 finite scores"),
    (json_body({"scores": [0.1, "high"]}), "expected 2 finite scores"),
    (b'{"scores": [0.1, NaN]}', "expected 2 finite scores"),
    (json_body({"scores": [0.1, 0.2], "extras": {"text": ["a"]}}), "malformed extras"),
])
def test_a_malformed_reply_is_bad_input(reply, needle):
    def route(method, path, headers, body):
        return (200, json_body(INFO)) if path == "/v1/info" else (200, reply)

    with running(fake_server(route)) as url:
        with pytest.raises(BadInput, match=needle):
            build_scorer(f"clip@{url}").score(noise_images(2), ["a", "b"])


def test_a_server_that_dies_mid_batch_is_bad_input_after_the_retries():
    calls = []

    def route(method, path, headers, body):
        if path == "/v1/info":
            return 200, json_body(INFO)
        calls.append(len(json.loads(body)["images"]))
        if len(calls) == 1:
            return 200, json_body({"scores": [0.5, 0.5]})

        def die():
            server.shutdown()
            server.server_close()

        threading.Thread(target=die, daemon=True).start()
        return 0, b""

    server = fake_server(route)
    with running(server) as url:
        remote = build_scorer(f"clip@{url}", batch_size=2, timeout=2.0, retries=3, backoff=0.05)
        with pytest.raises(BadInput, match="unreachable after 3 tries"):
            remote.score(noise_images(4), ["a"] * 4)
    assert calls == [2, 2]


def test_a_busy_server_is_retried_until_it_answers():
    answers = iter([(503, b"{}"), (503, b"{}"), (200, json_body({"scores": [0.25]}))])

    def route(method, path, headers, body):
        return (200, json_body(INFO)) if path == "/v1/info" else next(answers)

    with running(fake_server(route)) as url:
        scores = build_scorer(f"clip@{url}", retries=3, backoff=0.01).score(noise_images(1), ["a"])
    assert scores.tolist() == [0.25]


def test_no_server_at_the_address_is_unreachable_after_the_retries():
    with pytest.raises(BadInput, match="unreachable after 2 tries"):
        build_scorer(f"clip@http://127.0.0.1:{free_port()}", retries=2, backoff=0.0)


def test_serving_beyond_loopback_needs_a_token(clip_scorer):
    with pytest.raises(BadInput, match="needs a token"):
        serve(clip_scorer, "0.0.0.0", 0, None)
