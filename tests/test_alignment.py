"""Word alignments (`--print-alignment`): the attention weights, the merging of subwords into
the words of the raw lines, the output formats, and CTranslate2's `return_attention`."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from conftest import assert_one_line_error, run_nmt
from nmt.inference import word_alignment as wa
from nmt.inference.config import AlignmentConfig, SearchConfig, TranslateConfig
from nmt.inference.translator import load_translator
from nmt.model.config import TransformerConfig
from nmt.model.transformer import Transformer


def test_words_of_pieces_follow_the_raw_text_through_tokenization_and_normalisation():
    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    surfaces = wa.piece_surfaces(specials + ["\u2581Ein", "\u2581Hun", "d", "\u2581läuft", "."], range(4))[4:]
    assert wa.words_of_pieces(surfaces, "Ein Hund läuft.") == [0, 1, 1, 2, 2]
    # Moses split "läuft." into "läuft ." before the subwords: the pieces still map to the raw word.
    assert wa.words_of_pieces([" Ein", " Hund", " läuft", " ."], "Ein Hund läuft.") == [0, 1, 2, 2]
    # Normalisation changed a character (NFKC: full-width to ASCII), and an unknown piece has no text.
    assert wa.words_of_pieces([" ein", " Ｈund", " ", ""], "ein Hund 日本") == [0, 1, 2, 2]
    # WordPiece continuations and SentencePiece's word-start marks.
    assert wa.piece_surfaces(["<pad>", "<unk>", "<s>", "</s>", "##und", "\u2581H", "##"], range(4)) == ["", "", "", "", "und", " H", "##"]


def test_word_attention_averages_target_subwords_and_sums_source_subwords():
    # Target words: "Hun d" (pieces 0, 1) and "läuft" (piece 2); the eos row is ignored.
    # Source words: "dog" (piece 0) and "run s" (pieces 1, 2).
    attention = [[0.5, 0.25, 0.25], [0.1, 0.2, 0.7], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]
    matrix = wa.word_attention(attention, [0, 1, 1], 2, [0, 0, 1], 2)
    assert matrix == [pytest.approx([0.3, 0.7]), pytest.approx([0.0, 1.0])]
    assert wa.hard_alignment(matrix) == [(1, 0), (1, 1)]
    assert wa.pharaoh([(1, 0), (1, 1)]) == "1-0 1-1"
    # Rows are renormalised over the source tokens given (eos is not among them).
    assert wa.word_attention([[0.2, 0.2]], [0, 1], 2, [0], 1) == [pytest.approx([0.5, 0.5])]


def _model(layers: int = 2) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=32, d_ff=64, n_heads=4,
                            encoder_layers=2, decoder_layers=layers, dropout=0.0, max_positions=64)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("pre_ln", [False, True])
def test_the_weights_are_the_ones_the_decoder_attends_with(pre_ln):
    """softmax(QK^T/sqrt(d)) times V, per head, is the output of the layer's encoder-decoder
    attention: the weights are what the model computed, not a reconstruction."""
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=32, d_ff=64, n_heads=4, encoder_layers=2,
                            decoder_layers=2, dropout=0.0, max_positions=64, pre_ln=pre_ln)
    model = Transformer(cfg).eval()
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    prev = torch.tensor([[2, 10, 11], [2, 12, 0]])
    captured = {}
    layer = model.decoder_layers[1]
    layer.cross_attn.register_forward_hook(lambda m, args, kwargs, out: captured.update(x=args[0], out=out), with_kwargs=True)
    with torch.no_grad():
        model(src, prev)
        weights = model.cross_attention(src, prev, -1)
        enc = model.encode(src)
        k, v = layer.cross_attn.project_kv(enc.states)
        per_head = layer.cross_attn.attention_weights(captured["x"], (k, v), enc.attn_mask)
        out = layer.cross_attn.out_proj((per_head @ v).transpose(1, 2).reshape(2, 3, 32))
    assert torch.allclose(out, captured["out"], atol=1e-5)
    assert torch.allclose(weights, per_head.mean(1), atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3)) and (weights[1, :, 3] == 0).all()  # padding gets nothing


def test_a_hand_set_uniform_attention_aligns_every_word_to_the_longest_source_word(trained_tiny_run):
    """With the queries of the last layer's encoder-decoder attention set to zero, every
    target token attends to every source token alike: each output word's soft row is then the
    share of the source subwords each word has, and the hard alignment picks the word with most."""
    tr = load_translator(trained_tiny_run, cfg=TranslateConfig(device="cpu", threads=1),
                         alignment=AlignmentConfig(print_alignment=True, alignment_format="soft"))
    q_proj = tr.models[0].decoder_layers[-1].cross_attn.q_proj
    with torch.no_grad():
        q_proj.weight.zero_()
        q_proj.bias.zero_()
    line = "A man with a skateboard."
    pieces = tr.src_tokenizer.encode([line])[0]
    words = wa.words_of_pieces([wa.piece_surfaces(tr.src_tokenizer.pieces(), tr.src_tokenizer.special_ids)[t] for t in pieces], line)
    share = [words.count(w) / len(pieces) for w in range(len(line.split()))]
    prefix = ["Ein Mann"]  # the output has words whatever the edited model would say (it may say nothing)
    found = tr.translate([line], prefix)[0]
    assert found.hyp.startswith("Ein Mann") and len(found.alignment) == len(found.hyp.split())
    for row in found.alignment:
        assert row == pytest.approx(share, abs=1e-4)
    tr.alignment = AlignmentConfig(print_alignment=True)
    hard = tr.translate([line], prefix)[0].alignment
    assert hard == " ".join(f"{share.index(max(share))}-{j}" for j in range(len(found.hyp.split())))


def test_a_trained_model_aligns_far_better_than_chance_on_the_gold_set(trained_tiny_run, multi30k_dir):
    """The forced references of the 29 hand-aligned test_2016 pairs (bench/alignment_aer.py):
    the trained `tiny` model's last layer (58% AER when written) against random alignments
    (each target word to a random source word: about 90%)."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.alignment_aer import aer, read_gold, word_links

    gold = read_gold()
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        src = [line.rstrip("\n") for line in f]
    with gzip.open(multi30k_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        ref = [line.rstrip("\n") for line in f]
    index = sorted(gold)
    tr = load_translator(trained_tiny_run, cfg=TranslateConfig(device="cpu", threads=1))
    links = word_links(tr, src, ref, index, layer=-1)
    rng = random.Random(0)
    chance = [{(rng.randrange(len(src[i].split())), j) for j in range(len(ref[i].split()))} for i in index]
    model_aer, chance_aer = aer([links[i] for i in index], [gold[i] for i in index]), aer(chance, [gold[i] for i in index])
    assert model_aer < 0.7 and chance_aer > 0.8, (model_aer, chance_aer)


def test_names_and_numbers_align_to_themselves_in_a_trained_model(trained_tiny_run, multi30k_dir):
    """Reference words spelled as a word of their source (names, numbers: bench/alignment_aer.py's
    `identical_words`), forced through the trained `tiny` model over all of test_2016: most link
    to that source word far more often than a random source word would (tiny: 30% of 30 words
    against 8.5% when written; the recipe's `small`: 60%, see `make bench-alignment`)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.alignment_aer import identical_words, word_links

    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        src = [line.rstrip("\n") for line in f]
    with gzip.open(multi30k_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        ref = [line.rstrip("\n") for line in f]
    same = identical_words(src, ref)
    tr = load_translator(trained_tiny_run, cfg=TranslateConfig(device="cpu", threads=1))
    links = word_links(tr, src, ref, sorted({i for i, _, _ in same}), layer=-1)
    kept = sum((s, j) in links[i] for i, j, s in same) / len(same)
    chance = sum(1 / len(src[i].split()) for i, _, _ in same) / len(same)
    assert len(same) >= 20 and kept > 2.5 * chance, (len(same), kept, chance)


def test_formats_empty_lines_and_errors(trained_tiny_run):
    data = "A dog runs.\n\nTwo men.\n"
    text = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--print-alignment", "--quiet", input=data)
    plain = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--quiet", input=data)
    assert text.returncode == 0 and plain.returncode == 0, text.stderr + plain.stderr
    rows = text.stdout.split("\n")
    assert len(rows) == 4 and rows[1] == " ||| "
    assert [r.split(" ||| ")[0] for r in rows[:3]] == plain.stdout.split("\n")[:3]
    soft = run_nmt("translate", "-r", trained_tiny_run, "--threads", "1", "--print-alignment", "--alignment-format", "soft",
                   "--format", "jsonl", "--quiet", input=data)
    assert soft.returncode == 0, soft.stderr
    found = [json.loads(r) for r in soft.stdout.splitlines()]
    assert found[1]["alignment"] == [] and found[1]["hyp"] == ""
    matrix = found[0]["alignment"]
    assert len(matrix) == len(found[0]["hyp"].split()) and all(len(r) == 3 and sum(r) == pytest.approx(1) for r in matrix)
    assert_one_line_error(run_nmt("translate", "-r", trained_tiny_run, "--print-alignment", "--alignment-layer", "5",
                                  input=data), "--alignment-layer 5", "2-layer decoder")
    assert_one_line_error(run_nmt("translate", "-r", trained_tiny_run, "--print-alignment", "--alignment-format", "x",
                                  input=data), "--alignment-format", "hard")


def test_ctranslate2_attention_equals_nmts(trained_tiny_run, multi30k_dir):
    """The exported model's `return_attention` holds nmt's alignment layer, heads averaged; its
    first row (wrong in CTranslate2 4.8's CPU beam search) is taken from a one-step greedy call."""
    pytest.importorskip("ctranslate2")
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(60), f)]
    search = SearchConfig(beam_style="fairseq", lenpen_style="avg")
    both = [load_translator(trained_tiny_run, search=search, cfg=TranslateConfig(device="cpu", threads=1, engine=engine),
                            alignment=AlignmentConfig(print_alignment=True)) for engine in ("nmt", "ctranslate2")]
    ids = both[0].src_tokenizer.encode(lines)
    ours, theirs = (tr.decoder.decode(ids, search, None, tr.alignment_layer) for tr in both)
    compared = 0
    for a, b in zip(ours, theirs):
        if a[0].tokens == b[0].tokens:
            assert torch.allclose(torch.tensor(a[0].attention), torch.tensor(b[0].attention), atol=2e-3)
            compared += 1
    assert compared >= 55
    texts = [[t.alignment for t in tr.translate(lines)] for tr in both]
    assert sum(x == y for x, y in zip(*texts)) >= 55
    assert_one_line_error(run_nmt("translate", "-r", trained_tiny_run, "--engine", "ctranslate2", "--beam-style", "fairseq",
                                  "--lenpen-style", "avg", "--print-alignment", "--alignment-layer", "0", input="a dog\n"),
                          "--alignment-layer 0", "decoder layer 1", "--engine nmt")
