"""`nmt translate --engine ctranslate2`'s translator in a process of its own, timed as
bench/ct2_standalone.py times CTranslate2: the same lines, threads and search, with nmt's
tokenization and line handling around CTranslate2. Run by bench_translate.py, on an export
that is current (so no torch is imported: the JSON line says whether it was).

    python bench/ct2_engine.py RUN_DIR INPUT OUTPUT --threads 2 [--compute-type int8]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

START = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nmt.inference.config import SearchConfig, TranslateConfig  # noqa: E402
from nmt.inference.translator import load_translator  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute-type", default="default")
    parser.add_argument("--max-len-a", type=float, default=1.0)
    parser.add_argument("--max-len-b", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    search = SearchConfig(beam=4, beam_style="fairseq", lenpen_style="avg", max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    cfg = TranslateConfig(device="cpu", threads=args.threads, engine="ctranslate2", ct2_compute_type=args.compute_type)
    translator = load_translator(args.run_dir, search=search, cfg=cfg)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    loaded = time.perf_counter()
    best, out = math.inf, []
    for _ in range(args.repeat):
        start = time.perf_counter()
        out = translator.translate(lines)
        best = min(best, time.perf_counter() - start)
    args.output.write_text("".join(t.hyp + "\n" for t in out), encoding="utf-8")
    print(json.dumps({"compute_type": args.compute_type, "load_s": round(loaded - START, 3), "translate_s": round(best, 3),
                      "sentences_per_s": round(len(lines) / best, 1), "torch_imported": "torch" in sys.modules}))


if __name__ == "__main__":
    main()
