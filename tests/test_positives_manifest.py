"""recast.positives/1: the manifest round trip and its checks."""

from __future__ import annotations

import hashlib

import pytest

from recast_cli.artifacts import PositiveSample, read_positives, write_positives_manifest
from recast_cli.errors import BadInput


def _folder(tmp_path, n=2):
    samples = []
    for i in range(n):
        data = f"image {i}".encode()
        (tmp_path / "images").mkdir(exist_ok=True)
        (tmp_path / "images" / f"{i}.png").write_bytes(data)
        samples.append(PositiveSample(0, "a red circle", i, f"images/{i}.png", "renderer", 100 + i,
                                      hashlib.sha256(data).hexdigest()))
    return samples


def test_manifest_round_trip_keeps_rows_meta_and_provenance(tmp_path):
    samples = _folder(tmp_path)
    prov = write_positives_manifest(tmp_path, samples, meta={"refusals": {}}, config={"n": 2})
    back = read_positives(tmp_path)
    assert back.samples == tuple(samples) and back.meta == {"refusals": {}} and back.provenance == prov
    assert back.prompts() == ["a red circle"] and [s.sample_id for s in back.for_prompt(0)] == [0, 1]


def test_manifest_checks_images_against_their_sha256(tmp_path):
    write_positives_manifest(tmp_path, _folder(tmp_path))
    (tmp_path / "images" / "1.png").write_bytes(b"tampered")
    with pytest.raises(BadInput, match="does not match its sha256"):
        read_positives(tmp_path)
    (tmp_path / "images" / "1.png").unlink()
    with pytest.raises(BadInput, match="is missing"):
        read_positives(tmp_path)
    with pytest.raises(BadInput, match="no manifest.parquet"):
        read_positives(tmp_path / "images")


def test_manifest_rejects_duplicates_and_escaping_paths(tmp_path):
    samples = _folder(tmp_path)
    with pytest.raises(BadInput, match="duplicate"):
        write_positives_manifest(tmp_path, [samples[0], samples[0]])
    bad = PositiveSample(1, "p", 0, "../outside.png", "folder", -1, "0" * 64)
    write_positives_manifest(tmp_path, [bad])
    with pytest.raises(BadInput, match="leaves the positives folder"):
        read_positives(tmp_path)
