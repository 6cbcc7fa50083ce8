"""`nmt translate --sampling`: one drawn translation per line, reproducible by its seed, with the
line guarantees of beam search; top-k 1 is greedy search. And translate's progress bar only on
a terminal."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, finish, run_nmt, start_nmt
from nmt.inference.beam_search import beam_search
from nmt.model.transformer import Transformer
from nmt.model.config import build_config
from nmt.inference.sampling import restrict, sample
from nmt.inference.sampling_config import SamplingConfig
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.inference.config import SearchConfig
from test_translate import _lines, _make_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run directory with a random tiny model: its distribution is wide, so draws differ."""
    return _make_run(tmp_path_factory.mktemp("sampling"), _lines(300, seed=1), vocab_size=120)


def _source(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g)
    src = torch.full((n, int(lengths.max()) + 1), PAD_ID, dtype=torch.long)
    for i, length in enumerate(lengths.tolist()):
        src[i, :length] = torch.randint(4, vocab, (length,), generator=g)
        src[i, length] = EOS_ID
    return src


def _greedy_without_cache(model: Transformer, src: torch.Tensor, max_len: torch.Tensor) -> list[list[int]]:
    """Greedy search the slow way: the whole prefix through the decoder at every step."""
    out = []
    with torch.no_grad():
        for i in range(src.size(0)):
            row = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
            prefix = [BOS_ID]
            for step in range(int(max_len[i]) + 1):
                logits = model(row, torch.tensor([prefix]))[0, -1].float()
                logits[PAD_ID] = logits[BOS_ID] = float("-inf")
                token = EOS_ID if step == int(max_len[i]) else int(logits.argmax())
                if token == EOS_ID:
                    break
                prefix.append(token)
            out.append(prefix[1:])
    return out


def test_topk_1_is_greedy_search():
    from nmt.inference.beam_search import max_output_lengths

    torch.manual_seed(3)
    model = Transformer(build_config("tiny", 60, 60, max_positions=40)).eval()
    src = _source(12, 60, seed=0)
    search = SearchConfig(beam=1, max_len_b=10)
    drawn = [h[0].tokens for h in sample(model, src, SamplingConfig(sampling=True, sampling_topk=1, temperature=0.7),
                                         search, torch.Generator().manual_seed(5))]
    assert drawn == _greedy_without_cache(model, src, max_output_lengths(src, search, 40, model.cfg.pad_id))
    assert drawn == [h[0].tokens for h in beam_search(model, src, search)]


def test_draws_are_reproducible_by_seed_and_differ_across_seeds():
    torch.manual_seed(4)
    model = Transformer(build_config("tiny", 60, 60, max_positions=40)).eval()
    src = _source(16, 60, seed=1)
    search = SearchConfig(max_len_b=12)

    def draw(cfg: SamplingConfig, seed: int) -> list[list[int]]:
        return [h[0].tokens for h in sample(model, src, cfg, search, torch.Generator().manual_seed(seed))]

    for cfg in (SamplingConfig(sampling=True), SamplingConfig(sampling=True, sampling_topk=10),
                SamplingConfig(sampling=True, sampling_topp=0.9, temperature=1.5)):
        assert draw(cfg, 1) == draw(cfg, 1)
        assert draw(cfg, 1) != draw(cfg, 2)


def test_restrictions_keep_the_top_k_and_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda t: torch.isfinite(t)[0].tolist()  # noqa: E731
    assert kept(restrict(logits, 2, 0.0)) == [True, True, False, False]
    assert kept(restrict(logits, 0, 0.8)) == [True, True, False, False]
    assert kept(restrict(logits, 0, 0.81)) == [True, True, True, False]
    assert kept(restrict(logits, 0, 0.3)) == [True, False, False, False]
    assert kept(restrict(logits, 0, 0.0)) == [True] * 4


def test_cli_sampling_keeps_lines_and_is_reproducible(run):
    lines = _lines(25, seed=7)
    lines[3] = lines[11] = ""
    text = "\n".join(lines) + "\n"

    def translate(*flags: str) -> list[str]:
        proc = run_nmt("translate", "-r", run, "--threads", "1", "--sampling", *flags, input=text)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("\n")[:-1]

    first, again, other = translate("--seed", "3"), translate("--seed", "3"), translate("--seed", "4")
    assert len(first) == len(lines) and first == again and first != other
    assert first[3] == first[11] == ""
    greedy = translate("--sampling-topk", "1", "--seed", "9")
    proc = run_nmt("translate", "-r", run, "--threads", "1", "--beam", "1", input=text)
    assert greedy == proc.stdout.split("\n")[:-1]


def test_cli_refuses_sampling_settings_without_sampling_and_both_restrictions(run):
    assert_one_line_error(run_nmt("translate", "-r", run, "--sampling-topk", "5", input="a\n"), "add --sampling")
    assert_one_line_error(run_nmt("translate", "-r", run, "--sampling", "--sampling-topk", "5", "--sampling-topp", "0.9",
                                  input="a\n"), "not both")


def test_translate_draws_no_progress_bar_into_a_redirected_stderr(run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(_lines(600, seed=2)) + "\n", encoding="utf-8")
    with open(tmp_path / "err.txt", "wb") as err:
        proc = finish(start_nmt("translate", "-r", run, "-i", source, "--threads", "1", "--beam", "2", "--buffer-size", "20",
                                stdout=subprocess.PIPE, stderr=err), timeout=600)
    assert proc.returncode == 0
    assert proc.stdout.count(b"\n") == 600
    stderr = (tmp_path / "err.txt").read_bytes()  # bytes: read_text would turn "\r" into "\n"
    assert b"\r" not in stderr and b"600 lines" in stderr, stderr[:300]
