"""How good `nmt translate --print-alignment` is, per decoder layer, on a trained Multi30k model.

    python bench/alignment_aer.py RUN [--multi30k DIR]

The references of test_2016_flickr are forced through the model (teacher forcing, as
`--prefix-file` with the whole reference would), and their word alignments are read from each
decoder layer's attention with nmt's own merging (`nmt.inference.word_alignment`):
  - AER on the 29 hand-aligned pairs of bench/data/multi30k_test2016_gold_alignments.tsv:
    1 - 2|A & S| / (|A| + |S|) (Och and Ney 2003, sure links only), next to the AER of the
    diagonal (target word j to source word j * |X| / |Y|), which short, mostly monotone
    Multi30k pairs make a strong baseline;
  - identical words: of the reference words that occur once in their source, spelled the same
    (names, numbers, "T-Shirt"), the share aligned to that source word, over all 1000 pairs.
Prints one row per layer; writes a result file.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_MULTI30K, REPO, write_result  # noqa: E402

GOLD = REPO / "bench" / "data" / "multi30k_test2016_gold_alignments.tsv"


def read_gold(path: Path = GOLD) -> dict[int, set[tuple[int, int]]]:
    gold = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            index, links = line.split("\t")
            gold[int(index)] = {tuple(map(int, link.split("-"))) for link in links.split()}
    return gold


def aer(found: list[set], gold: list[set]) -> float:
    both = sum(len(a & s) for a, s in zip(found, gold))
    return 1.0 - 2.0 * both / (sum(map(len, found)) + sum(map(len, gold)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--multi30k", type=Path, default=DEFAULT_MULTI30K)
    args = ap.parse_args()
    from nmt.inference.config import TranslateConfig
    from nmt.inference.translator import load_translator

    gold = read_gold()
    with gzip.open(args.multi30k / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        src = [line.rstrip("\n") for line in f]
    with gzip.open(args.multi30k / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        ref = [line.rstrip("\n") for line in f]
    index = sorted(gold)
    tr = load_translator(args.run, cfg=TranslateConfig(device="cpu"))
    layers = tr.decoder.decoder_layers
    diagonal = [{(min(len(src[i].split()) - 1, round(j * len(src[i].split()) / len(ref[i].split()))), j)
                 for j in range(len(ref[i].split()))} for i in index]
    print(f"diagonal: AER {100 * aer(diagonal, [gold[i] for i in index]):.1f}%")
    same = identical_words(src, ref)
    rows = []
    for layer in range(layers):
        links = word_links(tr, src, ref, range(len(src)), layer)
        score = aer([links[i] for i in index], [gold[i] for i in index])
        kept = sum((s, j) in links[i] for i, j, s in same) / max(len(same), 1)
        rows.append({"layer": layer, "layer_from_end": layer - layers, "aer": round(score, 4),
                     "identical_words_aligned": round(kept, 4)})
        print(f"decoder layer {layer} ({layer - layers}): AER {100 * score:.1f}%, "
              f"identical words aligned to themselves {100 * kept:.1f}% of {len(same)}")
    write_result(f"alignment-aer-{args.run.name}", {"run": str(args.run), "pairs": len(index), "gold": GOLD.name,
                                                     "diagonal_aer": round(aer(diagonal, [gold[i] for i in index]), 4),
                                                     "identical_words": len(same), "layers": rows})


def identical_words(src: list[str], ref: list[str]) -> list[tuple[int, int, int]]:
    """(line, reference word, source word) for each reference word spelled as a word that occurs
    once in its source: names, numbers and the like, which a good alignment links to themselves
    (capitalized or a digit first, at least two characters, to leave out "a" and "in")."""
    found = []
    for i, (s, r) in enumerate(zip(src, ref)):
        words = s.split()
        for j, w in enumerate(r.split()):
            bare = w.strip(".,!?")
            if words.count(w) == 1 and len(bare) > 1 and (bare[0].isupper() or w[0].isdigit()):
                found.append((i, j, words.index(w)))
    return found


def word_links(tr: Any, src: list[str], ref: list[str], lines: Iterable[int], layer: int, batch: int = 100) -> dict[int, set]:
    """Each line's hard word alignment of its forced reference in decoder layer `layer`, with
    the models and tokenizers of the Translator `tr` (nmt's own engine)."""
    from nmt.inference import word_alignment as wa
    from nmt.inference.hypothesis import Hypothesis
    from nmt.inference.source_attention import attach_attention

    decoder = tr.decoder
    surfaces = wa.piece_surfaces(tr.src_tokenizer.pieces(), tr.src_tokenizer.special_ids), wa.piece_surfaces(tr.tgt_tokenizer.pieces(), tr.tgt_tokenizer.special_ids)
    lines = list(lines)
    out = {}
    for start in range(0, len(lines), batch):
        part = lines[start : start + batch]
        src_ids = tr.src_tokenizer.encode([src[i] for i in part])
        ref_ids = tr.tgt_tokenizer.encode([ref[i] for i in part])
        found = [[Hypothesis(list(r), 0.0, 0.0)] for r in ref_ids]
        attach_attention(decoder.models, decoder._source_tensor(src_ids), found, layer)
        for i, s_ids, r_ids, hyps in zip(part, src_ids, ref_ids, found):
            matrix = wa.align_words(hyps[0].attention, [surfaces[0][t] for t in s_ids], src[i],
                                    [surfaces[1][t] for t in r_ids], ref[i])
            out[i] = set(wa.hard_alignment(matrix))
    return out


if __name__ == "__main__":
    main()
