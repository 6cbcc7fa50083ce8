"""CTranslate2 as its own users run it, the baseline of `make bench-translate`: its own process,
which imports only ctranslate2 and sentencepiece (never torch, never nmt), one `translate_batch`
over all lines with CTranslate2's recommended batching (sorted, `max_batch_size` tokens,
`batch_type="tokens"`), on a model written by `nmt export --format ctranslate2`.

The search options are the ones that make CTranslate2's search nmt's `--beam-style fairseq
--lenpen-style avg` (so both do the same work and their outputs can be compared line by line);
none of them costs time: beam and alpha, eos counted in |Y| (`return_end_token`), empty output
allowed (`min_decoding_length=0`), pad and bos never generated, and one `max_decoding_length`
for the whole input: the largest of nmt's limits a * |X| + b + 1 (what a user passes is one number).

    python bench/ct2_standalone.py MODEL_DIR INPUT OUTPUT --inter 1 --intra 2 [--compute-type int8]

Prints one JSON line: seconds to load, to tokenize + translate + detokenize (`translate_s`),
sentences/s of that, the process's wall time so far, and the fastest run's start and end on
CLOCK_MONOTONIC (`window_monotonic`: bench/profile_decoders.py keeps the `perf` samples inside it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

START = time.perf_counter()

import ctranslate2  # noqa: E402
import sentencepiece  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--inter", type=int, default=1, help="inter_threads: translators working on batches in parallel")
    parser.add_argument("--intra", type=int, default=2, help="intra_threads: OpenMP threads of each translator")
    parser.add_argument("--compute-type", default="default")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=0.6)
    parser.add_argument("--max-len-a", type=float, default=1.0)
    parser.add_argument("--max-len-b", type=int, default=50)
    parser.add_argument("--max-batch-tokens", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=1, help="translate N times, keep the fastest")
    args = parser.parse_args()

    record = json.loads((args.model_dir / "nmt_export.json").read_text(encoding="utf-8"))
    if record.get("moses"):
        raise SystemExit("this export runs Moses around SentencePiece; the standalone baseline does not")
    src_sp = sentencepiece.SentencePieceProcessor(model_file=str(args.model_dir / record["tokenizer"][record["source_lang"]]))
    tgt_sp = sentencepiece.SentencePieceProcessor(model_file=str(args.model_dir / record["tokenizer"][record["target_lang"]]))
    translator = ctranslate2.Translator(str(args.model_dir), device="cpu", compute_type=args.compute_type,
                                        inter_threads=args.inter, intra_threads=args.intra)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    loaded = time.perf_counter()

    best, out, window = math.inf, [], (0.0, 0.0)
    for _ in range(args.repeat):
        start, started = time.perf_counter(), time.monotonic()
        pieces = src_sp.encode(lines, out_type=str)
        keep = [i for i, p in enumerate(pieces) if p]
        limit = min(record["max_positions"] - 1, max(math.floor(args.max_len_a * len(pieces[i]) + args.max_len_b) for i in keep)) + 1
        results = translator.translate_batch(
            [pieces[i] for i in keep], max_batch_size=args.max_batch_tokens, batch_type="tokens",
            beam_size=args.beam, length_penalty=args.lenpen, return_end_token=True, min_decoding_length=0,
            max_decoding_length=limit, suppress_sequences=[["<pad>"], ["<s>"]])
        out = [""] * len(lines)
        for i, text in zip(keep, tgt_sp.decode([[p for p in r.hypotheses[0] if p != "</s>"] for r in results])):
            out[i] = text
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, window = elapsed, (started, time.monotonic())
    args.output.write_text("".join(line + "\n" for line in out), encoding="utf-8")
    print(json.dumps({"inter_threads": args.inter, "intra_threads": args.intra, "compute_type": args.compute_type,
                      "load_s": round(loaded - START, 3), "translate_s": round(best, 3),
                      "sentences_per_s": round(len(lines) / best, 1), "wall_s": round(time.perf_counter() - START, 3),
                      "torch_imported": "torch" in sys.modules, "window_monotonic": window}))


if __name__ == "__main__":
    main()
