"""``recast preflight``'s reward and judge networks: built by the reward modules' own builders, at their
real sizes on the meta device (free), the same modules the scorers load at the tiny scale, scoring
with the scorers' own tensor functions; served and unbuilt names placed, never counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recast_cli.preflight.phases import ArchitectureScorer
from recast_cli.preflight.rewards import build_reward_model, empty, placement, rewards_build
from recast_cli.setting.load import load_setting


def counted(name: str, options: dict | None = None, scale: str = "full"):
    with empty():
        model = build_reward_model(name, options or {}, scale)
    assert all(p.device.type == "meta" for p in model.module.parameters())  # nothing allocated
    return model


def bert_with_cross_attention(vocab, hidden, inter, layers, positions, encoder_width) -> int:
    """BLIP's med.py BertModel (no token types, no pooler) with a cross-attention block per layer, by hand."""
    linear = lambda i, o: i * o + o  # noqa: E731
    norm = 2 * hidden
    self_attention = 3 * linear(hidden, hidden) + linear(hidden, hidden) + norm
    cross_attention = linear(hidden, hidden) + 2 * linear(encoder_width, hidden) + linear(hidden, hidden) + norm
    feed_forward = linear(hidden, inter) + linear(inter, hidden) + norm
    return vocab * hidden + positions * hidden + norm + layers * (self_attention + cross_attention + feed_forward)


def vit(width, inter, layers, patch, image) -> int:
    """A ViT with a class token, learned positions, a final norm: BLIP's create_vit, by hand."""
    linear = lambda i, o: i * o + o  # noqa: E731
    block = 2 * 2 * width + linear(width, 3 * width) + linear(width, width) + linear(width, inter) + linear(inter, width)
    tokens = (image // patch) ** 2 + 1
    return 3 * patch * patch * width + width + width + tokens * width + layers * block + 2 * width


def test_the_real_reward_networks_have_their_published_sizes_on_the_meta_device():
    clip, pick, hps = counted("clip"), counted("pick"), counted("hps")
    assert clip.parameters == pytest.approx(428e6, rel=0.02)  # CLIP ViT-L/14
    assert hps.parameters == pytest.approx(986e6, rel=0.02)  # open_clip ViT-H-14
    assert pick.parameters == hps.parameters  # PickScore is the same CLIP-H/14, in transformers' layout
    assert (clip.image_size, clip.text_tokens, hps.image_size, hps.text_tokens) == (224, 77, 224, 77)
    aesthetic = counted("aesthetic")
    head = 768 * 1024 + 1024 + 1024 * 128 + 128 + 128 * 64 + 64 + 64 * 16 + 16 + 16 + 1
    assert aesthetic.parameters == clip.parameters + head and aesthetic.text_tokens == 0
    imagereward = counted("imagereward")
    parts = imagereward.module
    assert sum(p.numel() for p in parts.visual_encoder.parameters()) == vit(1024, 4096, 24, 16, 224)  # 303.3 M
    assert sum(p.numel() for p in parts.text_encoder.parameters()) == bert_with_cross_attention(
        30524, 768, 3072, 12, 512, 1024)  # 142.0 M
    assert imagereward.parameters == vit(1024, 4096, 24, 16, 224) + bert_with_cross_attention(
        30524, 768, 3072, 12, 512, 1024) + (1024 * 256 + 256) + (768 * 256 + 256) + head
    assert imagereward.text_tokens == 35


def test_a_weights_folder_s_config_is_built_instead_of_the_shipped_one(tmp_path, monkeypatch):
    from tests.rewards.tiny_models import save_tiny_clip

    monkeypatch.delenv("RECAST_CLIP_PATH", raising=False)
    folder = save_tiny_clip(tmp_path / "clip")
    model = counted("clip", {"weights": str(folder)})
    assert model.configs == str(folder / "config.json") and model.image_size == 32
    assert counted("clip").configs == "pipelines/configs/clip-vit-large-patch14/config.json"  # found nowhere
    monkeypatch.setenv("RECAST_CLIP_PATH", str(folder))  # where the scorer itself would look next
    assert counted("clip").configs == str(folder / "config.json")


def test_the_builders_make_the_modules_the_scorers_load(tmp_path):
    """The tiny folders of the reward tests, loaded by the scorers, against the preflight builders."""
    import open_clip

    from recast_cli.rewards import build_scorer, hfclip
    from recast_cli.rewards.hps import architecture_config, build_architecture
    from tests.rewards.tiny_models import save_tiny_clip, save_tiny_hps

    def shapes(module):
        return {k: tuple(v.shape) for k, v in module.state_dict().items()}

    folder = save_tiny_clip(tmp_path / "clip")
    loaded = hfclip.load_model("clip", folder, torch.device("cpu"))
    assert shapes(hfclip.build_model(loaded.config.to_dict())) == shapes(loaded)
    config, checkpoint = save_tiny_hps(tmp_path)
    scorer = build_scorer("hps", weights=checkpoint, arch=str(config))
    assert shapes(build_architecture(architecture_config(str(config)))) == shapes(scorer.model)
    assert type(scorer.model) is open_clip.model.CLIP


def test_an_architecture_scorer_scores_with_the_scorers_own_function(tmp_path):
    """Its clip module holding the tiny ClipScore's weights, it gives ClipScore's scores on the same pixels
    and tokens: the score is hfclip.scaled_cosine, not a copy."""
    from recast_cli.rewards import build_scorer, hfclip
    from tests.rewards.tiny_models import save_tiny_clip

    folder = save_tiny_clip(tmp_path / "clip")
    real = build_scorer("clip", weights=folder)
    with empty():
        model = build_reward_model("clip", {"weights": str(folder)}, "full")
    stand = ArchitectureScorer(model, torch.device("cpu"), batch_size=2, seed=0)
    stand.module.load_state_dict(real.model.state_dict())
    pixels = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 100, (3, 77), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    expected = hfclip.scaled_cosine(real.model, pixels, ids, mask, 30.0)
    torch.testing.assert_close(stand.forward(stand.module, pixels, ids, mask), expected)
    scores = stand.score(torch.rand(5, 3, 40, 40), ["a"] * 5)  # resized to 32, chunks of 2
    assert scores.shape == (5,) and np.isfinite(scores).all() and np.ptp(scores) > 0


@pytest.mark.parametrize("name", ["clip", "pick", "hps", "aesthetic", "imagereward"])
def test_every_tiny_network_materialises_and_scores(name):
    with empty():
        model = build_reward_model(name, {}, "tiny")
    scorer = ArchitectureScorer(model, torch.device("cpu"), batch_size=3, seed=1)
    scores = scorer.score(torch.rand(4, 3, 48, 48), ["a red circle"] * 4)
    assert scores.shape == (4,) and np.isfinite(scores).all()
    scorer.close()
    assert scorer.module is None and model.module is None  # nothing else holds the weights


def test_served_host_and_unbuilt_scorers_are_named_and_not_counted():
    assert placement("clip") == ("model", "")
    assert placement("imagereward@http://127.0.0.1:9000")[0] == "served"
    assert placement("unifiedreward")[0] == "served" and placement("geneval")[0] == "served"
    assert placement("ocr")[0] == "host" and placement("toy_sharpness")[0] == "host"
    assert placement("hpsv3")[0] == "not built" and placement("my_pkg.rewards:Mine")[0] == "not built"
    table = rewards_build(load_setting("geneval"), "tiny")
    assert table["scorers"]["geneval"]["placement"] == "served" and "geneval" in table["not_counted"]
    assert "parameters" not in table["scorers"]["geneval"]
