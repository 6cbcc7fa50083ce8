"""A forced target prefix (`--prefix-file`, `prefix=`, "prefix"): the output starts with it, the
search continues from it, and on the same exported weights it agrees with CTranslate2's
`target_prefix`."""

from __future__ import annotations

import gzip
import random

import pytest
import torch

from conftest import assert_one_line_error, run_nmt
from nmt.data.batching import source_tensor
from nmt.data.tokenizer import EOS_ID
from nmt.inference.beam_search import beam_search
from nmt.inference.config import SearchConfig, TranslateConfig
from nmt.inference.translator import load_translator

N_LINES = 200


@pytest.fixture(scope="module")
def pairs(multi30k_dir) -> list[tuple[str, str]]:
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        src = [line.rstrip("\n") for _, line in zip(range(N_LINES), f)]
    with gzip.open(multi30k_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        ref = [line.rstrip("\n") for _, line in zip(range(N_LINES), f)]
    return list(zip(src, ref))


def _random_prefixes(refs: list[str], seed: int = 1) -> list[str]:
    """The first 1 to n-1 words of each reference, or none for every fifth line."""
    rng = random.Random(seed)
    return ["" if i % 5 == 4 else " ".join(r.split()[: rng.randint(1, max(1, len(r.split()) - 1))]) for i, r in enumerate(refs)]


@pytest.mark.parametrize("style", ["t2t", "fairseq", "shrink"])
def test_every_beam_style_starts_with_the_prefix_and_scores_what_follows(trained_tiny_run, pairs, style):
    tr = load_translator(trained_tiny_run, cfg=TranslateConfig(device="cpu", threads=1))
    src_ids = tr.src_tokenizer.encode([s for s, _ in pairs[:20]])
    prefixes = [ids[:3] for ids in tr.tgt_tokenizer.encode([r for _, r in pairs[:20]])]
    prefixes[1] = []
    model = tr.models[0]
    src = source_tensor(src_ids)
    found = beam_search(model, src, SearchConfig(beam_style=style, lenpen_style="avg", nbest=2), prefixes=prefixes)
    plain = beam_search(model, src, SearchConfig(beam_style=style, lenpen_style="avg", nbest=2))
    assert found[1] == plain[1]
    for hyps, prefix, s in zip(found, prefixes, src_ids):
        assert hyps and all(h.tokens[: len(prefix)] == prefix for h in hyps)
        # log_prob is log P(continuation | prefix), eos included; |Y| counts the prefix.
        best = hyps[0]
        with torch.no_grad():
            logits = model(source_tensor([s]), torch.tensor([[2, *best.tokens]]))
        lp = torch.log_softmax(logits[0].float(), -1).gather(1, torch.tensor([*best.tokens, EOS_ID])[:, None])[:, 0]
        assert best.log_prob == pytest.approx(float(lp[len(prefix):].sum()), abs=1e-3)
        assert best.score == pytest.approx(best.log_prob / (len(best.tokens) + 1) ** 0.6, abs=1e-4)


def test_the_prefix_file_forces_each_line_and_an_empty_prefix_line_changes_nothing(trained_tiny_run, pairs, tmp_path):
    src = [s for s, _ in pairs[:30]]
    prefixes = _random_prefixes([r for _, r in pairs[:30]])
    (tmp_path / "in.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "prefix.de").write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    args = ["translate", "-r", trained_tiny_run, "--threads", "1", "--quiet", "-i", tmp_path / "in.en"]
    forced = run_nmt(*args, "--prefix-file", tmp_path / "prefix.de")
    plain = run_nmt(*args)
    assert forced.returncode == 0 and plain.returncode == 0, forced.stderr + plain.stderr
    for out, want, prefix in zip(forced.stdout.splitlines(), plain.stdout.splitlines(), prefixes):
        assert out.startswith(prefix) if prefix else out == want, (prefix, out)
    (tmp_path / "short.de").write_text("\n".join(prefixes[:10]) + "\n", encoding="utf-8")
    assert_one_line_error(run_nmt(*args, "--prefix-file", tmp_path / "short.de"), "has 10 lines", "30")
    piped = run_nmt("translate", "-r", trained_tiny_run, "--prefix-file", tmp_path / "short.de", input="\n".join(src) + "\n")
    assert_one_line_error(piped, "has 10 lines", "one prefix line per input line")
    (tmp_path / "long.de").write_text("ein " * 60 + "\n", encoding="utf-8")
    too_long = run_nmt("translate", "-r", trained_tiny_run, "--quiet", "--prefix-file", tmp_path / "long.de", input="A dog.\n")
    assert_one_line_error(too_long, "line 1: its prefix takes", "--max-len-b")


def test_prefixes_agree_with_ctranslate2_target_prefix(trained_tiny_run, pairs):
    """Same exported weights, `--beam-style fairseq --lenpen-style avg`: the prefix forced,
    its log-probability not counted, |Y| counting it, and only the best candidate may end
    right after it, as CTranslate2 does."""
    pytest.importorskip("ctranslate2")
    src = [s for s, _ in pairs]
    prefixes = _random_prefixes([r for _, r in pairs])
    search = SearchConfig(beam_style="fairseq", lenpen_style="avg")
    outputs = [load_translator(trained_tiny_run, search=search, cfg=TranslateConfig(device="cpu", threads=1, engine=engine))
               .translate(src, prefixes) for engine in ("nmt", "ctranslate2")]
    same = sum(a.hyp == b.hyp for a, b in zip(*outputs))
    assert same >= 0.99 * len(src), [(a.hyp, b.hyp) for a, b in zip(*outputs) if a.hyp != b.hyp]
    assert all(a.hyp.startswith(p) for a, p in zip(outputs[0], prefixes))
