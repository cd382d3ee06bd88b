#!/bin/bash
# alternate binaries, rounds; print per-binary per-n median of medians
R=${R:-8}; shift 0
for r in $(seq $R); do for v in "$@"; do INT8=1 A8=1 OMP_WAIT_POLICY=ACTIVE /tmp/mm$v 2 7 | awk -v v=$v '{print v, $1, $3}'; done; done > /tmp/ab.out
python3 - "$@" <<'P'
import sys,statistics as st,collections
d=collections.defaultdict(list)
for l in open('/tmp/ab.out'):
    v,n,t=l.split(); d[(v,n)].append(float(t))
for v in sys.argv[1:]:
    b=st.median(d[(v,'n=1')])
    print(v.ljust(8),' '.join(f"{n[2:]}:{st.median(d[(v,n)]):.2f}({st.median(d[(v,n)])/b:.2f})" for n in [f'n={i}' for i in range(1,9)]))
P
