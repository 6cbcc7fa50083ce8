"""Terminology constraints (`--constraints`, `constraints=`, "constraints"): every phrase in every
output, lines without constraints untouched, clear errors where they cannot be met."""

from __future__ import annotations

import gzip
import random

import pytest

from conftest import assert_one_line_error, run_nmt
from nmt.inference.constrained_search import ConstraintState, stripe

N_LINES = 200


def test_the_state_follows_phrases_in_any_order_and_drops_broken_progress():
    state = ConstraintState.start([(5, 6), (7,)])
    assert state.bank == 0 and state.next_tokens() == {5, 7}
    state = state.advance(5)
    assert state.bank == 1 and state.next_tokens() == {6, 5, 7}
    broken = state.advance(9)  # off the phrase: its progress is lost
    assert broken.bank == 0 and not any(broken.met)
    state = state.advance(6).advance(8).advance(7)
    assert state.complete and state.bank == 3
    twice = ConstraintState.start([(4,), (4,)]).advance(4)
    assert twice.met == (True, False) and twice.advance(4).complete  # two equal phrases need two occurrences
    restart = ConstraintState.start([(1, 1, 2)]).advance(1).advance(1).advance(1)
    assert restart.bank == 2 and restart.advance(2).complete  # "1 1 1 2" still holds "1 1 2"


def test_beam_slots_are_dealt_from_the_banks_highest_first():
    def cand(logp, bank):
        state = ConstraintState.start([(1, 2, 3)])
        for token in (1, 2, 3)[:bank]:
            state = state.advance(token)
        return (logp, 0, bank, state)

    candidates = [cand(-1.0, 0), cand(-1.5, 0), cand(-2.0, 0), cand(-9.0, 1), cand(-8.0, 2), cand(-3.0, 0)]
    chosen = stripe(candidates, 4)
    assert [c[0] for c in chosen] == [-8.0, -9.0, -1.0, -1.5]


@pytest.fixture(scope="module")
def constrained_input(multi30k_dir, tmp_path_factory):
    """test_2016 sources; two lines in three with 1-2 phrases sampled from their reference
    (single words or two-word runs), fairseq's tab-separated convention."""
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        src = [line.rstrip("\n") for _, line in zip(range(N_LINES), f)]
    with gzip.open(multi30k_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        ref = [line.rstrip("\n") for _, line in zip(range(N_LINES), f)]
    rng = random.Random(3)
    phrases = []
    for i, r in enumerate(ref):
        words = [w.strip(".,!?\"") for w in r.split()]
        words = [w for w in words if w]
        picked = []
        if i % 3 != 2:
            for _ in range(rng.choice((1, 2))):
                n = rng.choice((1, 2)) if len(words) > 1 else 1
                start = rng.randrange(len(words) - n + 1)
                picked.append(" ".join(words[start : start + n]))
        phrases.append(picked)
    folder = tmp_path_factory.mktemp("constraints")
    (folder / "in.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (folder / "in.tsv").write_text("\n".join("\t".join([s, *p]) for s, p in zip(src, phrases)) + "\n", encoding="utf-8")
    return folder, phrases


@pytest.mark.parametrize("style,lines", [("t2t", N_LINES), ("fairseq", 60)])
def test_every_phrase_is_in_every_output_and_other_lines_are_unchanged(trained_tiny_run, constrained_input, style, lines):
    folder, phrases = constrained_input
    args = ["translate", "-r", trained_tiny_run, "--threads", "2", "--quiet", "--beam-style", style]
    cut = {name: "".join((folder / name).read_text(encoding="utf-8").splitlines(keepends=True)[:lines]) for name in ("in.tsv", "in.en")}
    constrained = run_nmt(*args, "--constraints", input=cut["in.tsv"])
    plain = run_nmt(*args, input=cut["in.en"])
    assert constrained.returncode == 0 and plain.returncode == 0, constrained.stderr + plain.stderr
    outputs, plain_outputs = constrained.stdout.splitlines(), plain.stdout.splitlines()
    assert len(outputs) == len(plain_outputs) == lines
    for out, want, line_phrases in zip(outputs, plain_outputs, phrases[:lines], strict=True):
        if line_phrases:
            assert all(p in out for p in line_phrases), (line_phrases, out)
        else:
            assert out == want  # byte-identical: the plain search, in the same batches


def test_constraint_errors_are_one_line(trained_tiny_run):
    base = ["translate", "-r", trained_tiny_run, "--quiet", "--constraints"]
    long_phrase = "\t" + " ".join(["Hund"] * 60)
    assert_one_line_error(run_nmt(*base, input="A dog.\nA cat." + long_phrase + "\n"), "line 2: its constraints take",
                          "--max-len-b")
    assert_one_line_error(run_nmt(*base, "--beam-style", "shrink", input="A dog.\tHund\n"), "--beam-style", "shrink")
    pytest.importorskip("ctranslate2")
    ct2 = run_nmt(*base, "--engine", "ctranslate2", "--beam-style", "fairseq", "--lenpen-style", "avg", input="A dog.\tHund\n")
    assert_one_line_error(ct2, "no constrained search", "--engine nmt")


def test_a_line_without_a_tab_or_with_empty_phrases_has_no_constraints(trained_tiny_run):
    data = "A dog runs.\nA dog runs.\t\t \nA dog runs.\tKatze\n"
    proc = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--quiet", "--constraints", input=data)
    assert proc.returncode == 0, proc.stderr
    first, second, third = proc.stdout.splitlines()
    assert first == second and "Katze" in third
