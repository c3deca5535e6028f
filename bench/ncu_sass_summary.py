"""Summarise an Nsight Compute per-instruction export: where a kernel's warps stall.

    ncu -i report.ncu-rep --page source --csv --print-source sass -k regex:NAME > NAME.csv
    python -m bench.ncu_sass_summary NAME.csv [TOP]

Prints the share of stall samples per reason and per opcode, then the TOP (25) instructions with the
most samples and their two main stall reasons.
"""
import csv, sys, collections
f = sys.argv[1]
rows = list(csv.reader(open(f)))
hdr = rows[1]; data = [r for r in rows[2:] if len(r) == len(hdr)]
ix = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = collections.Counter(); byop = collections.Counter(); samples = 0
for r in data:
    s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0); samples += s
    op = r[ix["Source"]].split()[0] if r[ix["Source"]].strip() else "?"
    if op.startswith("@"): op = r[ix["Source"]].split()[1]
    byop[op.split(".")[0]] += s
    for c in stall_cols:
        v = r[ix[c]]
        tot[c] += int(float(v)) if v else 0
print("samples", samples)
print("stalls:", ", ".join(f"{k[6:]} {v/samples:.1%}" for k, v in tot.most_common(10)))
print("by opcode:", ", ".join(f"{k} {v/samples:.1%}" for k, v in byop.most_common(14)))
top = sorted(data, key=lambda r: -int(r[ix["Warp Stall Sampling (All Samples)"]] or 0))[:int(sys.argv[2]) if len(sys.argv) > 2 else 25]
for r in top:
    s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    st = sorted(((int(float(r[ix[c]] or 0)), c[6:]) for c in stall_cols), reverse=True)[:2]
    print(f"{r[ix['Address']]:>6} {s/samples:6.2%} {r[ix['Source']][:60]:60} {st}")
