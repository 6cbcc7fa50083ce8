"""Terminology constraints (`--constraints`, `constraints=`, "constraints"): every phrase in every
output, lines without constraints untouched, clear errors where they cannot be met."""

from __future__ import annotations

import gzip
import random
from typing import Sequence

import pytest

import torch

from conftest import assert_one_line_error, run_nmt
from nmt.inference.config import SearchConfig
from nmt.inference.constrained_search import NO_TOKEN, ConstraintStates, constrained_beam_search, deal
from nmt.inference.hypothesis import TargetRequest
from nmt.inference.translator import TranslateConfig, load_translator
from nmt.model.config import build_config
from nmt.model.transformer import Transformer

N_LINES = 200


class ConstraintState:
    """One hypothesis' progress through its phrases: a row of `ConstraintStates`, read one at a time."""

    def __init__(self, rows: ConstraintStates):
        self.rows = rows

    @classmethod
    def start(cls, phrases: Sequence[Sequence[int]]) -> "ConstraintState":
        return cls(ConstraintStates.start([phrases], 1, torch.device("cpu")))

    @property
    def met(self) -> tuple[bool, ...]:
        return tuple(self.rows.met[0].tolist())

    @property
    def bank(self) -> int:
        return int(self.rows.bank[0])

    @property
    def complete(self) -> bool:
        return bool(self.rows.complete[0])

    def next_tokens(self) -> set[int]:
        return set(self.rows.next_tokens(NO_TOKEN)[0].tolist()) - {NO_TOKEN}

    def advance(self, token: int) -> "ConstraintState":
        return ConstraintState(self.rows.advance(torch.tensor([token])))


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


def stripe(candidates: list[tuple[float, int, int, ConstraintState]], k: int) -> list[tuple[float, int, int, ConstraintState]]:
    """`deal` over one sentence's (log-probability, row, token, state) candidates."""
    ranked = sorted(candidates, key=lambda c: -c[0])
    positions, real = deal(torch.tensor([[c[3].bank for c in ranked]]), min(k, len(ranked)))
    return [ranked[p] for p in positions[real].tolist()]


def test_beam_slots_are_dealt_from_the_banks_highest_first():
    def cand(logp, bank):
        state = ConstraintState.start([(1, 2, 3)])
        for token in (1, 2, 3)[:bank]:
            state = state.advance(token)
        return (logp, 0, bank, state)

    candidates = [cand(-1.0, 0), cand(-1.5, 0), cand(-2.0, 0), cand(-9.0, 1), cand(-8.0, 2), cand(-3.0, 0)]
    chosen = stripe(candidates, 4)
    assert [c[0] for c in chosen] == [-8.0, -9.0, -1.0, -1.5]


def test_a_candidates_bank_is_the_bank_of_the_state_it_would_reach():
    rng = random.Random(0)
    states = ConstraintStates.start([[(5, 6), (7,), (5, 5, 6)], [(4,), (4,)]], beam=3, device=torch.device("cpu"))
    for _ in range(12):
        tokens = torch.tensor([[rng.choice((4, 5, 6, 7, 8)) for _ in range(5)] for _ in range(6)])  # (rows, candidates)
        banks = states.banks_after(tokens)
        for x in range(tokens.size(1)):
            assert banks[:, x].tolist() == states.advance(tokens[:, x]).bank.tolist()
        states = states.advance(tokens[:, 0])


def _eos_prone_tiny(seed: int) -> Transformer:
    """A random tiny model over 16 ids whose eos is likely enough that hypotheses also end early."""
    torch.manual_seed(seed)
    model = Transformer(build_config("tiny", 16, 16, max_positions=64, output_bias=True)).eval()
    with torch.no_grad():
        model.output_bias[model.cfg.special_ids.eos] = 5.0
    return model


RECORDED_REQUESTS = [TargetRequest((), ((5,), (7, 5))),  # two phrases end on one token: one is met per token
                     TargetRequest((), ((6, 6, 8),)),  # "6 6 6 8" holds it too
                     TargetRequest((), ((9,), (9,), (10, 11))),  # equal phrases need two occurrences
                     TargetRequest((12, 4), ((13,), (14, 15, 4)))]  # after a prefix
RECORDED = {
    # (models, settings): per sentence, the nbest (tokens, score) of the first (per-candidate Python) implementation
    (1, (("beam", 4), ("nbest", 3))): [
        [("7 5 5 5 5 5", -10.9750), ("7 5 5 5 5 5 5", -11.0714), ("7 5 5 5 5 5 5 5", -11.2049)],
        [("6 6 8 8 8 8 8 8 8 8", -17.1914), ("8 8 8 8 8 8 8 8 8 8", -12.1894), ("8 8 8 8 8 8 8 8 8 6", -15.0547)],
        [("9 9 10 11 11 11 11 11 11 11", -16.6156), ("8 8 8 9 8 8 8 8 8 8", -11.6787), ("8 8 8 9 8 8 8 8 8 9", -13.1496)],
        [("12 4 13 13 13 13 13 14 15 4", -19.2602), ("12 4 13 13 13 13 13 13 13 13", -13.2843), ("12 4 13 13 13 13 13 13 13 14", -14.9124)],
    ],
    (2, (("beam", 4), ("nbest", 3))): [
        [("5 7 7 7 7 7 7 7 7 5", -14.6260), ("7 7 7 7 7 7 7 7 7 7", -12.1708), ("5 7 7 7 7 7 7 7 7 7", -12.8039)],
        [("6 6 8 8 8 8 8 8", -14.1827), ("6 6 8 8 8 8 8 8 8", -14.6648), ("6 6 8 8 8 8 8 8 8 8", -15.1750)],
        [("9 9 9 10 11 11 11 11 11 11", -16.9930), ("9 9 9 9 9 9 9 9 9 9", -14.1430), ("9 9 9 9 9 9 9 9 9 10", -15.8708)],
        [("12 4 13 14 14 14 14 14 15 4", -20.9693), ("12 4 14 14 14 14 14 14 14 14", -15.9487), ("12 4 14 14 14 14 14 14 14 15", -17.6988)],
    ],
    (1, (("beam", 3), ("nbest", 2), ("beam_style", "fairseq"), ("lenpen_style", "avg"), ("lenpen", 1.0))): [
        [("5 7 5 5 5 5 5 5 5 5", -2.1357), ("5 5 5 5 5 5 5 5 5 5", -1.6204)],
        [("6 6 8 8 8", -3.5340), ("6 6 8 8", -3.7929)],
        [("9 9 10 11 11 11 11 11", -2.8988), ("9 9 10 11 11 11 11", -3.0120)],
        [("12 4 13 13 13 14 14 14 15 4", -3.4316), ("12 4 13 13 13 14 14 14 14 14", -2.9272)],
    ],
    (1, (("beam", 5), ("nbest", 5), ("lenpen", 0.0), ("max_len_b", 6))): [
        [("7 5 5 5 5 5", -16.6350), ("7 5 5 5 5 8", -18.5472), ("8 8 8 8 8 8", -12.4894), ("5 5 5 5 5 5", -13.5084), ("5 5 5 5 5 7", -17.0609)],
        [("6 6 8 8 8 8", -23.3780), ("6 6 8 8 8 9", -25.6208), ("8 8 8 8 8 8", -14.6036), ("8 8 8 8 8 6", -19.8507), ("8 8 8 8 6 6", -23.1750)],
        [("9 9 10 11 11 11", -22.1707), ("8 8 8 8 8 8", -11.2546), ("9 8 8 8 8 8", -13.9370), ("9 8 8 8 8 9", -16.4225), ("9 8 8 8 9 10", -19.9962)],
        [("12 4 14 15 4 13", -24.1702), ("12 4 8 8 8 8", -11.9880), ("12 4 13 13 13 13", -12.9731), ("12 4 13 13 13 14", -16.1266), ("12 4 13 13 14 15", -22.0738)],
    ],
}


@pytest.mark.parametrize("n_models, settings", list(RECORDED))
def test_the_tensor_bookkeeping_finds_what_the_first_implementation_found(one_thread, n_models, settings):
    """Same hypotheses, order and scores as the per-candidate Python search recorded here, with
    phrases met in any order, several at once, twice, after a prefix, or not by the limit."""
    src = torch.tensor([[5, 9, 12, 7, 3, 0, 0], [6, 6, 13, 4, 8, 11, 3], [10, 14, 9, 3, 0, 0, 0], [15, 5, 5, 8, 12, 3, 0]])
    cfg = SearchConfig(max_len_a=0.0, **{"max_len_b": 10, **dict(settings)})
    found = constrained_beam_search([_eos_prone_tiny(seed) for seed in range(n_models)], src, cfg, RECORDED_REQUESTS)
    for hyps, want in zip(found, RECORDED[n_models, settings], strict=True):
        assert [" ".join(map(str, h.tokens)) for h in hyps] == [tokens for tokens, _ in want]
        assert [h.score for h in hyps] == pytest.approx([score for _, score in want], abs=2e-4)


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


def test_a_phrase_the_target_vocabulary_cannot_spell_is_named_once_and_counted(trained_tiny_run, capsys):
    data = "A dog runs.\tHund\nA tree.\tΩste\nA cat.\tΩ\tKatze\n"
    proc = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--quiet", "--constraints", input=data)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "vocabulary lacks" in line]
    assert len(warnings) == 1 and "line 2: constraint 'Ωste'" in warnings[0] and "⁇" in warnings[0]
    assert "⁇" in proc.stdout.splitlines()[1]  # what <unk> "meets" the phrase with
    translator = load_translator(trained_tiny_run, cfg=TranslateConfig(device="cpu", threads=1))
    translator.translate(["A tree.", "A cat."], constraints=[["Ωste"], ["Ω", "Katze"]])
    translator.translate(["A tree."], constraints=[["Ωste"]])
    assert translator.unknown_constraints == 3
    assert capsys.readouterr().err.count("vocabulary lacks") == 1
