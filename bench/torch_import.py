"""What `import torch` costs a process, for each given Python (a venv with one torch wheel each):
the CPU-only wheel against the default CUDA build, on a machine without a GPU.

    python bench/torch_import.py .venv/bin/python /path/to/cuda-venv/bin/python [--repeat 3]

Prints, per interpreter, torch's version, the best of --repeat import times in fresh
processes, their peak RSS, the size of the installed torch package and of the whole
site-packages (the CUDA build brings its nvidia-* libraries); writes
bench/results/DATE_COMMIT_MACHINE_bench-torch-import.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

PROBE = ("import resource, time; t = time.perf_counter(); import torch, os; "
         "print(torch.__version__, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "
         "os.path.dirname(torch.__file__))")


def package_mib(folder: str) -> float:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pythons", nargs="+")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for python in args.pythons:
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run([python, "-W", "ignore", "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
            runs.append((float(out[1]), float(out[2])))
        row = {"python": python, "torch": out[0], "import_s": round(min(r[0] for r in runs), 2),
               "import_s_all": [round(r[0], 2) for r in runs], "peak_rss_mib": round(max(r[1] for r in runs)),
               "package_mib": round(package_mib(out[3])),
               "site_packages_mib": round(package_mib(str(Path(out[3]).parent)))}
        rows.append(row)
        print(f"torch {row['torch']}: import {row['import_s']} s (best of {args.repeat}), peak RSS "
              f"{row['peak_rss_mib']} MiB, package {row['package_mib']} MiB, site-packages {row['site_packages_mib']} MiB", file=sys.stderr)
    write_result("torch-import", {"bench": "torch-import", "wheels": rows})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
