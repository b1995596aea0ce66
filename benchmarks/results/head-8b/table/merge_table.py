"""Merge a tuned table (bench_kernels.py table --missing) into the package's linear_configs.json,
one shape a line as that file keeps them."""
import json
import sys
from pathlib import Path

from specgen.gpu import linear_table as T

raw = json.loads(T.PACKAGED.read_text())
merged = T.load(Path(sys.argv[1])).over(T.packaged())
about = raw["about"].replace("benchmarks/family_pairs.py and of the bench pair, tuned on an H200",
                             "benchmarks/family_pairs.py (and of the EAGLE-3 heads its --head builds, tuned in a later "
                             "call with --missing) and of the bench pair, tuned on an H200")
lines = [json.dumps({"n": n, "k": k, "gated": g, "plain": list(p), "split": list(s)})
         for (n, k, g), p, s in merged.entries]
text = ('{"format": 1,\n "about": ' + json.dumps(about) + ',\n "tuned_on": ' + json.dumps(raw["tuned_on"]) +
        ', "rows": ' + json.dumps(raw["rows"]) + ',\n "shapes": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n")
T.PACKAGED.write_text(text)
print(len(merged.entries), "shapes")
