"""The optional `reward` column of recast.positives/1: one positive set per reward, or one for all."""

from __future__ import annotations

import hashlib

import pytest

from recast_cli.artifacts import PositiveSample, read_positives, write_positives_manifest
from recast_cli.errors import BadInput


def sample(tmp_path, reward, sample_id=0, name="draw-3.png"):
    data = b"one draw"
    (tmp_path / name).write_bytes(data)
    return PositiveSample(0, "p", sample_id, name, "self", 3, hashlib.sha256(data).hexdigest(), reward)


def test_rows_of_two_rewards_may_share_one_draw(tmp_path):
    rows = [sample(tmp_path, "clip"), sample(tmp_path, "ocr")]
    write_positives_manifest(tmp_path, rows)
    back = read_positives(tmp_path)
    assert back.rewards() == ("clip", "ocr") and back.for_prompt(0, "ocr") == [rows[1]]
    with pytest.raises(BadInput, match="none for reward 'hps'"):
        back.for_prompt(0, "hps")


def test_shared_positives_serve_any_reward(tmp_path):
    write_positives_manifest(tmp_path, [sample(tmp_path, None)])
    back = read_positives(tmp_path)
    assert back.rewards() == () and len(back.for_prompt(0, "anything")) == 1 and len(back.for_prompt(0)) == 1


def test_mixed_or_duplicate_reward_rows_are_rejected(tmp_path):
    with pytest.raises(BadInput, match="every row names its reward or none"):
        write_positives_manifest(tmp_path, [sample(tmp_path, "clip"), sample(tmp_path, None, sample_id=1)])
    with pytest.raises(BadInput, match="duplicate"):
        write_positives_manifest(tmp_path, [sample(tmp_path, "clip"), sample(tmp_path, "clip")])


def test_a_manifest_without_the_column_reads_as_shared(tmp_path):
    import pyarrow.parquet as pq

    write_positives_manifest(tmp_path, [sample(tmp_path, None)])
    table = pq.read_table(tmp_path / "manifest.parquet")
    pq.write_table(table.drop_columns(["reward"]).replace_schema_metadata(table.schema.metadata),
                   tmp_path / "manifest.parquet")
    assert read_positives(tmp_path).samples[0].reward is None
