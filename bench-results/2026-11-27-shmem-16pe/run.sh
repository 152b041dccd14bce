#!/bin/bash
# Device run: OSU OpenSHMEM collectives on 16 PEs (and reduce on 8): weft's library before
# this session's collectives work (base, a8626ba), after it (new), and Open MPI's OpenSHMEM
# (built here with oshcc), alternating. Output on stdout.
cd "$(dirname "$0")"
nproc; oshcc --showme:version 2>&1 | head -1
pkill -f 'osu_oshm|osu_[a-z]*-(base|new|ompi)' ; sleep 1; echo "leftover: $(pgrep -fc 'osu_')"
S=osu/c
for p in reduce broadcast collect fcollect barrier; do
  oshcc -O2 -DPACKAGE_VERSION=\"7.4\" -I$S/util $S/openshmem/osu_oshm_$p.c $S/util/osu_util.c $S/util/osu_util_pgas.c -lm -o osu_$p-ompi 2>&1 | grep -i error
done
run() { # n prog args...
  local n=$1 p=$2; shift 2
  for v in base new ompi; do
    echo "== $p n=$n $v"
    if [ $v = ompi ]; then
      timeout 90 oshrun --allow-run-as-root -np $n ./osu_$p-ompi "$@" 2>ompi.err | grep -v '^#' | grep -v '^$'
      [ -s ompi.err ] && tail -3 ompi.err
    else
      timeout 90 ./weft run -n $n --raw --timeout 80 -- ./osu_$p-$v "$@" | grep -v '^#' | grep -v '^$'
    fi
  done
}
for round in 1 2; do
  run 16 reduce -m 1048576
  run 16 broadcast -m 65536
  run 16 collect -m 16384
  run 16 fcollect -m 16384
  run 16 barrier
  run 8 reduce -m 1048576
done
