"""Tests of `recast sample-positive` and `recast compare-gains`."""
