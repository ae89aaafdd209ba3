#!/usr/bin/env python3
# Usage: scripts/ncu_regions.py NCU_SOURCE.csv [TOP_N] [OUTPUT_WG_SETMAXNREG_HEX]
# The CSV comes from: ncu --section SourceCounters --section WarpStateStats --page source
#   --print-source sass --csv ... (see scripts/device_run.sh); kernels with setmaxnreg roles.
# Summarize an ncu source-page CSV (SASS) by kernel role: regions start at each USETMAXREG.
import csv, sys, collections
path = sys.argv[1]
lines = open(path).read().split('\n')
start = next(i for i, l in enumerate(lines) if l.startswith('"Address"'))
rows = list(csv.reader(lines[start:]))
hdr = rows[0]; rows = [r for r in rows[1:] if len(r) == len(hdr)]
col = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith('stall_') and '(Not Issued)' not in h]
def num(r, h):
    try: return float(r[col[h]] or 0)
    except ValueError: return 0.0
regions = []  # (start index, name)
# Role by the setmaxnreg that opens the region (the code layout is output, scores, producers
# here; the final cluster barrier and exit follow the producers' code).
cur = 'prologue'
tag = []
for r in rows:
    src = r[col['Source']]
    if 'USETMAXREG' in src:
        cur = 'producers' if 'DEALLOC' in src else ('output' if src.strip().endswith(sys.argv[3] if len(sys.argv) > 3 else '0xa8') else 'scores')
    if 'UCGABAR_ARV' in src and cur != 'prologue': cur = 'epilogue'
    tag.append(cur)
tot = collections.Counter(); inst = collections.Counter(); stalls = collections.defaultdict(collections.Counter)
for r, t in zip(rows, tag):
    tot[t] += num(r, 'Warp Stall Sampling (All Samples)'); inst[t] += num(r, 'Instructions Executed')
    for h in stall_cols: stalls[t][h] += num(r, h)
all_s = sum(tot.values())
for t in tot:
    top = ', '.join(f"{h[6:]} {v/ max(tot[t],1):.0%}" for h, v in stalls[t].most_common(6))
    print(f"{t:10s} samples {tot[t]:8.0f} ({tot[t]/all_s:.0%})  instr {inst[t]:10.0f}  | {top}")
N = int(sys.argv[2]) if len(sys.argv) > 2 else 12
for region in ['producers', 'scores', 'output']:
    print(f"--- top {N} in {region}")
    rs = [(num(r, 'Warp Stall Sampling (All Samples)'), r) for r, t in zip(rows, tag) if t == region]
    rs.sort(key=lambda x: -x[0])
    for s, r in rs[:N]:
        st = sorted(((num(r, h), h[6:]) for h in stall_cols), reverse=True)[:3]
        print(f"{r[col['Address']]:>6s} {s:7.0f} {r[col['Source']][:60]:60s} " + ' '.join(f"{n}:{v:.0f}" for v, n in st))
