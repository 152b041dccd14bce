import subprocess, sys, statistics, collections
prog = sys.argv[1]; runs = int(sys.argv[2]); variants = sys.argv[3].split(',')
res = {v: collections.defaultdict(list) for v in variants}
for r in range(runs):
    for v in variants:
        if v == 'ompi':
            cmd = ['timeout','120','oshrun','--allow-run-as-root','-np','2',f'/tmp/perf/osu_{prog}-{v}'] + sys.argv[4:]
        else:
            cmd = ['/work/main/target/release/weft','run','-n','2','--timeout','120','--',f'/tmp/perf/osu_{prog}-{v}'] + sys.argv[4:]
        out = subprocess.run(cmd,capture_output=True,text=True).stdout
        out = '\n'.join(('[0] ' + l) if v == 'ompi' else l for l in out.splitlines())
        for l in out.splitlines():
            w = l.split()
            if len(w) >= 3 and w[1].isdigit():
                res[v][int(w[1])].append(float(w[2]))
            elif len(w) == 2 and prog == 'barrier':
                try: res[v][0].append(float(w[1]))
                except: pass
sizes = sorted(res[variants[0]])
for s in sizes[:12]:
    print(s, '  '.join('%s %.3f' % (v, statistics.median(res[v][s])) for v in variants if res[v][s]))
