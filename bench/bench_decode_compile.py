"""Does `torch.compile` of the decoder step pay off on CPU? One process, one trained run:
nmt's beam search with the decoder step in eager mode (on a CPU in fp32, the packed step of
`nmt.ops.cpu_decoder_step`), then with the model's `decode_step_hidden` under
`torch.compile(dynamic=True)`, on the Multi30k test lines (best of 2 each, one worker:
--inter-threads 1, so both time the same thread layout).

    .venv/bin/python bench/bench_decode_compile.py RUN_DIR [--threads 2] [--beam-style fairseq]

Prints sentences/s of both, the compilation time (the compiled run's first 64 lines), and
how many lines are identical; writes bench/results/DATE_COMMIT_MACHINE_bench-decode-compile.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_MULTI30K, REPO, read_lines, write_result  # noqa: E402

sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data", type=Path, default=DEFAULT_MULTI30K)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--beam-style", default="fairseq", choices=["t2t", "fairseq"])
    args = parser.parse_args()

    import torch

    from nmt.inference.config import SearchConfig, TranslateConfig
    from nmt.inference.translator import load_translator

    source = args.data / "test_2016_flickr.en.gz"
    if not source.is_file():
        raise SystemExit(f"no input at {source}; pass --data")
    lines = read_lines(source)
    style = {"beam_style": "fairseq", "lenpen_style": "avg"} if args.beam_style == "fairseq" else {}
    search = SearchConfig(beam=4, lenpen=0.6, **style)
    translator = load_translator(args.run_dir, search=search,
                                 cfg=TranslateConfig(threads=args.threads, device="cpu", inter_threads=1))
    ids = translator.src_tokenizer.encode(lines)

    def best_of_two() -> tuple[float, list[list[int]]]:
        seconds = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            found = translator.decoder.decode(ids, search)
            seconds = min(seconds, time.perf_counter() - start)
        return len(lines) / seconds, [h[0].tokens if h else [] for h in found]

    translator.decoder.decode(ids[:64], search)  # warm-up
    eager, eager_out = best_of_two()
    print(f"eager: {eager:.1f} sentences/s", file=sys.stderr)
    model = translator.models[0]
    model.decode_step_hidden = torch.compile(model.decode_step_hidden, dynamic=True)
    start = time.perf_counter()
    translator.decoder.decode(ids[:64], search)
    compile_s = time.perf_counter() - start
    compiled, compiled_out = best_of_two()
    same = sum(a == b for a, b in zip(eager_out, compiled_out))
    print(f"compiled decoder step: {compiled:.1f} sentences/s = {compiled / eager:.2f}x eager, "
          f"{compile_s:.1f} s to compile (first 64 lines), {same}/{len(lines)} lines identical", file=sys.stderr)
    result = {"bench": "decode-compile", "run": str(args.run_dir), "threads": args.threads, "beam_style": args.beam_style,
              "eager_sentences_per_s": round(eager, 1), "compiled_sentences_per_s": round(compiled, 1),
              "ratio": round(compiled / eager, 3), "compile_seconds": round(compile_s, 1), "identical_lines": same,
              "torch": torch.__version__}
    write_result("decode-compile", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
