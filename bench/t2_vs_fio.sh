#!/bin/sh
# bench/t2_vs_fio.sh — the T2 store against fio on the same file, block size
# and queue depth: sequential and random block writes and reads.
#
#   bench/t2_vs_fio.sh [-b BUILD_DIR] [-d DIR] [-m FILE_MIB] [-q QD] [-n BATCH]
#                      [-s "BS BS ..."] [-r ROUNDS] [-e uring|threads|auto] [-k SYNC_EVERY] [-H]
#
# Each round runs bench_t2_io (T2: one untimed fill, then median of 3 runs of
# each pattern) and fio on the very file T2 writes, alternating who goes first (its
# records start after the 4 KiB superblock: fio gets --offset=4096 and the same
# span), io_uring engine with registered buffers (--fixedbufs, as T2 registers
# its staging buffers), O_DIRECT, the same --bs and --iodepth. Writes: T2 makes
# every batch of BATCH records durable with one fdatasync (-k K: plus a
# background one every K writes inside the batch); fio is given --fdatasync=BATCH, twice: with the
# io_uring engine and with libaio. NOTE: the device's flush counter
# (/sys/class/block/DEV/stat field 16) is recorded around every run: with fio
# 3.33's io_uring engine the syncs reach no device flush at all (the write is
# then not durable), while libaio's do, so the libaio column is the baseline
# with T2's guarantee. fio issues no sync after the last --fdatasync=BATCH
# group (7 flushes for 8 batches, none at all for a single batch), so its
# write runs also get --end_fsync=1: they end durable, as every T2 batch
# does. Reads: T2 also
# verifies each record (XXH3 over the extent, the hash) and copies the payload
# out. The ratio printed is T2 / fio, median over rounds.
# -H: also run fio with huge-page buffers (--mem=shmhuge; reads on io_uring
# with --fixedbufs, writes on libaio) and print a second table against them.
# T2 stages its I/O in transparent huge pages (tiers/t2_io.c): a large
# block is then one physically contiguous segment, one request and one
# virtio descriptor, where fio's default malloc'd 4 KiB pages cost one
# descriptor per page (and a split at max_segments). -H gives fio the same
# memory: the like-for-like baseline. It needs a hugetlb pool of at least
# QD x BS + 4 MiB (e.g. sysctl vm.nr_hugepages=48 for QD 32 x 1 MiB); the
# script does not change it.
set -eu

BUILD=build
DIR=/tmp/kvt_t2_bench
MIB=512
QD=32
BATCH=""
SIZES="16384 131072 1048576"
ROUNDS=3
MODE=auto
SYNC_EVERY=0
HUGE=0
while getopts b:d:m:q:n:s:r:e:k:H o; do
	case $o in
	b) BUILD=$OPTARG ;;
	d) DIR=$OPTARG ;;
	m) MIB=$OPTARG ;;
	q) QD=$OPTARG ;;
	n) BATCH=$OPTARG ;;
	s) SIZES=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	e) MODE=$OPTARG ;;
	k) SYNC_EVERY=$OPTARG ;;
	H) HUGE=1 ;;
	*) sed -n '3,5p' "$0"; exit 2 ;;
	esac
done
[ -n "$BATCH" ] || BATCH=$((QD * 4))
BENCH=$BUILD/bench_t2_io
[ -x "$BENCH" ] || { echo "t2_vs_fio: $BENCH not built (cmake --build $BUILD --target bench_t2_io)"; exit 1; }
command -v fio >/dev/null || { echo "t2_vs_fio: fio not installed"; exit 1; }
if [ "$HUGE" = 1 ]; then
	MAXBS=0
	for BS in $SIZES; do [ "$BS" -gt "$MAXBS" ] && MAXBS=$BS; done
	NEED=$(( (QD * MAXBS + 4194304 + 2097151) / 2097152 ))
	FREE=$(awk '/HugePages_Free/{print $2}' /proc/meminfo)
	HPS=$(awk '/Hugepagesize/{print $2}' /proc/meminfo)
	[ "$HPS" = 2048 ] && [ "$FREE" -ge "$NEED" ] ||
		{ echo "t2_vs_fio: -H needs $NEED free 2 MiB huge pages, $FREE free (of $HPS KiB): sysctl vm.nr_hugepages=$NEED"; exit 1; }
fi
mkdir -p "$DIR"
FILE=$DIR/t2_vs_fio.dat
OUT=$(mktemp)
trap 'rm -f "$OUT" "$FILE"' EXIT

echo "# t2_vs_fio: $(uname -srm), $(nproc) CPUs, $(df -T "$DIR" | awk 'NR==2{print $1" "$2}'), $(fio --version)"
echo "# file $FILE: $MIB MiB, iodepth $QD, write batch $BATCH records per fdatasync, T2 io_mode $MODE, T2 sync_every $SYNC_EVERY, $ROUNDS rounds, fio huge-page buffers too: $HUGE"

# flush requests the device has completed (field 16 of the block stat; n/a if unknown)
DEV=$(basename "$(df "$DIR" | awk 'NR==2{print $1}')")
flushes() { [ -r "/sys/class/block/$DEV/stat" ] && awk '{print $16}' "/sys/class/block/$DEV/stat" || echo 0; }

run_t2() { # round
	F0=$(flushes)
	"$BENCH" --file "$FILE" --file-mib "$MIB" --bs "$BS" --qd "$QD" --batch "$BATCH" --mode "$MODE" --reps 3 --sync-every "$SYNC_EVERY" |
		sed "s/^{/{\"round\":$1,/" >>"$OUT"
	echo "{\"round\":$1,\"engine\":\"t2\",\"pattern\":\"flushes\",\"bs\":$BS,\"n\":$(( $(flushes) - F0 ))}" >>"$OUT"
}

run_fio() { # round engine rw [mem]
	SYNC=""
	case $3 in *write) SYNC="--fdatasync=$BATCH --end_fsync=1" ;; esac
	FIX=""
	[ "$2" = io_uring ] && FIX="--fixedbufs"
	MEM=${4:-malloc}
	SUFFIX=""
	[ "$MEM" = malloc ] || SUFFIX="-huge"
	F0=$(flushes)
	J=$(fio --name=t2cmp --filename="$FILE" --offset=4096 --size="$SPAN" --bs="$BS" --iodepth="$QD" \
		--ioengine="$2" $FIX --mem="$MEM" --direct=1 --rw="$3" $SYNC --output-format=json 2>/dev/null)
	NF=$(( $(flushes) - F0 ))
	echo "$J" | python3 -c "
import json, sys
j = json.load(sys.stdin)['jobs'][0]
rw = '$3'
bw = j['write' if 'write' in rw else 'read']['bw_bytes']
pat = {'write': 'seqwrite', 'read': 'seqread', 'randread': 'randread', 'randwrite': 'randwrite'}[rw]
print(json.dumps({'round': $1, 'engine': 'fio-$2$SUFFIX', 'pattern': pat, 'bs': $BS, 'qd': $QD, 'MBps': round(bw / 1e6, 1), 'flushes': $NF}))
" >>"$OUT"
}

run_fio_all() { # round
	for RW in write read randread randwrite; do
		run_fio "$1" io_uring "$RW"
		case $RW in *write) run_fio "$1" libaio "$RW" ;; esac
		if [ "$HUGE" = 1 ]; then
			case $RW in *write) run_fio "$1" libaio "$RW" shmhuge ;; *) run_fio "$1" io_uring "$RW" shmhuge ;; esac
		fi
	done
}

for BS in $SIZES; do
	N=$((MIB * 1048576 / BS))
	SPAN=$((N * BS))
	[ "$BATCH" -le "$N" ] || { echo "t2_vs_fio: batch $BATCH > $N records of $BS bytes"; exit 2; }
	for R in $(seq 1 "$ROUNDS"); do
		# alternate who goes first (the file exists after round 1)
		if [ $((R % 2)) -eq 1 ]; then run_t2 "$R"; run_fio_all "$R"; else run_fio_all "$R"; run_t2 "$R"; fi
	done
done

python3 - "$OUT" <<'EOF2'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(v):
    return statistics.median(v) if v else float('nan')
print("| bs | pattern | T2 MB/s | fio io_uring MB/s | T2 / fio io_uring | fio libaio MB/s (flushes) | T2 / fio libaio |")
print("|---|---|---|---|---|---|---|")
for bs in sorted({r['bs'] for r in rows}):
    for pat in ['seqwrite', 'randwrite', 'seqread', 'randread']:
        def get(eng):
            return {r['round']: r for r in rows if r['bs'] == bs and r['pattern'] == pat and r['engine'] == eng}
        t2, fu, fa = get('t2'), get('fio-io_uring'), get('fio-libaio')
        ru = [t2[k]['MBps'] / fu[k]['MBps'] for k in sorted(t2) if k in fu]
        ra = [t2[k]['MBps'] / fa[k]['MBps'] for k in sorted(t2) if k in fa]
        cell_a = "%.0f (%d)" % (med([r['MBps'] for r in fa.values()]), med([r['flushes'] for r in fa.values()])) if fa else "-"
        print("| %d KiB | %s | %.0f | %.0f | %s = **%.2fx** | %s | %s |" % (
            bs // 1024, pat, med([r['MBps'] for r in t2.values()]), med([r['MBps'] for r in fu.values()]),
            " ".join("%.2f" % x for x in ru), med(ru), cell_a,
            ("%s = **%.2fx**" % (" ".join("%.2f" % x for x in ra), med(ra))) if ra else "-"))
if any(r['engine'].endswith('-huge') for r in rows):
    print()
    print("Against fio with huge-page buffers (--mem=shmhuge; reads io_uring --fixedbufs, writes libaio):")
    print()
    print("| bs | pattern | T2 MB/s | fio huge MB/s (flushes) | T2 / fio huge |")
    print("|---|---|---|---|---|")
    for bs in sorted({r['bs'] for r in rows}):
        for pat in ['seqwrite', 'randwrite', 'seqread', 'randread']:
            eng = 'fio-libaio-huge' if 'write' in pat else 'fio-io_uring-huge'
            t2 = {r['round']: r for r in rows if r['bs'] == bs and r['pattern'] == pat and r['engine'] == 't2'}
            fh = {r['round']: r for r in rows if r['bs'] == bs and r['pattern'] == pat and r['engine'] == eng}
            rh = [t2[k]['MBps'] / fh[k]['MBps'] for k in sorted(t2) if k in fh]
            fl = (" (%d)" % med([r['flushes'] for r in fh.values()])) if 'write' in pat and fh else ""
            print("| %d KiB | %s | %.0f | %.0f%s | %s = **%.2fx** |" % (bs // 1024, pat, med([r['MBps'] for r in t2.values()]),
                  med([r['MBps'] for r in fh.values()]), fl, " ".join("%.2f" % x for x in rh), med(rh)))
fl = [r for r in rows if r['pattern'] == 'flushes']
fu = [r['flushes'] for r in rows if r['engine'] == 'fio-io_uring' and 'write' in r['pattern']]
print()
print("device flushes per T2 run (all patterns, the untimed fill included): median %s; per fio io_uring write run: %s" % (
    med([r['n'] for r in fl]), sorted(set(fu))))
EOF2
