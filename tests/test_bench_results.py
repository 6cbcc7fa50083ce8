"""bench/results keeps every measurement: RESULTS.md rows link to these files."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402


def test_a_second_run_of_a_bench_on_the_same_day_and_commit_gets_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "REPO", tmp_path)
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    first = common.write_result("train", {"tgt_tokens_per_s": 8511.0})
    second = common.write_result("train", {"tgt_tokens_per_s": 8996.6})
    third = common.write_result("train", {"tgt_tokens_per_s": 9000.0})
    assert len({first, second, third}) == 3
    assert second.name == first.name.replace(".json", "-2.json") and third.name.endswith("-3.json")
    assert json.loads(first.read_text())["tgt_tokens_per_s"] == 8511.0
    assert json.loads(second.read_text())["tgt_tokens_per_s"] == 8996.6
