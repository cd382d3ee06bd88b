import csv,glob,collections,sys,statistics as st
d=sys.argv[1]
rows=collections.defaultdict(dict)
for f in sorted(glob.glob(d+'/*/bench.csv')):
    run=f.split('/')[-2]
    for r in csv.DictReader(open(f)):
        if r['engine']!='specdemo': continue
        rows[run][r['task']]=(float(r['speedup']),float(r['mean_acceptance_length']),float(r['tokens_per_s']),float(r['plain_tokens_per_s']))
tasks=['code','maths','grounded','chat','creative']
for run in sorted(rows):
    print(run.ljust(12),' '.join(f"{t[:5]}:{rows[run][t][0]:.2f}({rows[run][t][1]:.2f})" for t in tasks))
for v in sorted({r.rsplit('-',1)[0] for r in rows}):
    rs=[r for r in rows if r.rsplit('-',1)[0]==v]
    print('median',v.ljust(5),' '.join(f"{t[:5]}:{st.median(rows[r][t][0] for r in rs):.2f}" for t in tasks))
