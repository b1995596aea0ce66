"""Add the tuned table's draft picks to the package table's shapes that have none (line by line,
the file's own layout). argv: tuned.json package.json"""
import json, re, sys
tuned = {(s["n"], s["k"], s["gated"]): s["draft"] for s in json.load(open(sys.argv[1]))["shapes"] if "draft" in s}
lines = open(sys.argv[2]).read().split("\n")
for i, line in enumerate(lines):
    m = re.match(r'\s*\{"n": (\d+), "k": (\d+), "gated": (true|false),', line)
    if m and '"draft"' not in line:
        key = (int(m[1]), int(m[2]), m[3] == "true")
        if key in tuned:
            end = line.rindex("}")
            lines[i] = line[:end] + f', "draft": {json.dumps(tuned[key])}' + line[end:]
            print("draft pick", key, tuned[key])
open(sys.argv[2], "w").write("\n".join(lines))
json.load(open(sys.argv[2]))
