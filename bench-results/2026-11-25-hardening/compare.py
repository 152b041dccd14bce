import json,statistics,glob,math,sys
def load(pat):
    runs=[]
    for f in sorted(glob.glob(pat)):
        d={}
        for l in open(f):
            try: o=json.loads(l)
            except: continue
            d[(o['suite'],o['metric']+' @'+str(o.get('bytes')))]=(o['value'],o['unit'])
        runs.append(d)
    return runs
# Runs as /tmp/ab-{base,new}-N.json, or as DIR/{base,new}-N.json with DIR as the argument.
pre = sys.argv[1].rstrip('/') + '/' if len(sys.argv) > 1 else '/tmp/ab-'
B=load(pre+'base-*.json'); N=load(pre+'new-*.json')
keys=[k for k in B[0] if all(k in r for r in B+N)]
rows=[]
for k in keys:
    b=statistics.median(r[k][0] for r in B); n=statistics.median(r[k][0] for r in N)
    unit=B[0][k][1]
    hb = '/s' in unit
    r = (b/n if hb else n/b) if b and n else float('nan')
    rows.append((r,k,b,n,unit))
rows.sort()
print("runs", len(B), len(N), "metrics:",len(rows))
print("geomean new/base (time-like, >1 = slower): %.3f" % math.exp(sum(math.log(r[0]) for r in rows if r[0]==r[0] and r[0]>0)/len(rows)))
for suite in ['rma','am','rpc','coll']:
    rs=[r[0] for r in rows if r[1][0]==suite and r[0]==r[0] and r[0]>0]
    if rs: print(suite, "n=%d geomean %.3f min %.3f max %.3f" % (len(rs), math.exp(sum(map(math.log,rs))/len(rs)), min(rs), max(rs)))
for r in rows[:5]+rows[-10:]:
    print(f"{r[0]:.3f} {r[1][0]:5} {r[1][1][:55]:55} base {r[2]:.4g} new {r[3]:.4g} {r[4]}")
