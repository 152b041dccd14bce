import json,glob,statistics,sys,math
def load(p):
    R=[]
    for f in sorted(glob.glob(p)):
        d={}
        for l in open(f):
            try:o=json.loads(l)
            except:continue
            d[(o['suite'],o['metric'])]=(o['value'],o['unit'])
        R.append(d)
    return R
D=sys.argv[1]; B=load(D+'/base-*.json'); N=load(D+'/new-*.json')
flt=sys.argv[2] if len(sys.argv)>2 else ''
out=[]
for k in B[0]:
    if not all(k in r for r in B+N): continue
    if flt not in k[0]+' '+k[1]: continue
    b=statistics.median(r[k][0] for r in B); n=statistics.median(r[k][0] for r in N)
    hb='/s' in B[0][k][1]
    out.append(((b/n if hb else n/b), k, b, n, B[0][k][1], [round(r[k][0],3) for r in B],[round(r[k][0],3) for r in N]))
for o in sorted(out): print("%.3f %-5s %-50s b=%.4g n=%.4g %s" % (o[0],o[1][0],o[1][1],o[2],o[3],o[4]))
v=[o[0] for o in out if o[0]>0]; print("geomean", math.exp(sum(map(math.log,v))/len(v)), len(v))
