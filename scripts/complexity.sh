#!/usr/bin/env bash
# The complexity ceiling (docs/complexity.md; issue 48): lizard measures every
# function of tiers/, index/ and engine/serve/, and this script
#  - FAILS (exit 1) on a function in a GATED file whose length (lizard's "length": lines from
#    its name to its closing brace) is over MAX_LENGTH or whose cyclomatic complexity (CCN)
#    is over MAX_CCN, unless a waiver names why;
#  - REPORTS the same measure for every other file it scans, without failing.
# scripts/test.sh runs it before the builds, so a violation fails fast.
#
# A waiver is one comment on the line before the function's first line, after its doc comment
# (or the line before that, when the return type has a line of its own), naming why the
# function stays whole:
#	/* lizard: waive — a config table, one case per key */
# ("-" or "--" for the dash is accepted too). A waiver with no reason is itself a failure.
# lizard's own "#lizard forgives" is refused in gated files: it hides the function from the
# report altogether and asks for no reason.
#
# lizard (PyPI, pinned below so the counts do not move under the gate) is installed into the
# test venv (.venv-test, or $KVT_TEST_VENV) when missing, as test.sh installs the openai client.
# Exit: 0 no gated violation, 1 gated violations, 2 lizard could not run.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- what is measured, what is gated ----------------------------------------------------
MAX_LENGTH=100		# lines per function (lizard "length")
MAX_CCN=30		# cyclomatic complexity per function (lizard "CCN")
# Scanned and reported (every C source and header of these folders).
SCANNED_DIRS=(tiers index engine/serve)
# Gated: a violation here fails. Shell patterns on the path from the repository root; the
# files issue 48 split into one concept per file.
GATED_FILES=(
	'tiers/*.c'
	'engine/serve/scheduler*.c'
	'engine/serve/sched_*.c'
	'engine/serve/sessions*.c'
)
LIZARD_VERSION=1.24.3
# ------------------------------------------------------------------------------------------

venv=${KVT_TEST_VENV:-.venv-test}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
have=$("$venv/bin/python" -m lizard --version 2>/dev/null || true)
if [ "$have" != "$LIZARD_VERSION" ]; then
	"$venv/bin/pip" install -q "lizard==$LIZARD_VERSION"
fi

is_gated() {
	local f=$1 pat
	for pat in "${GATED_FILES[@]}"; do
		# shellcheck disable=SC2053  # $pat is a pattern on purpose
		[[ $f == $pat ]] && return 0
	done
	return 1
}

# The waiver's reason for the function whose name is on line $2 of file $1, or nothing.
waiver_of() {
	local f=$1 start=$2 ln text
	for ln in $((start - 1)) $((start - 2)); do
		[ "$ln" -ge 1 ] || continue
		text=$(sed -n "${ln}p" "$f")
		if [[ $text =~ lizard:\ *waive ]]; then
			text=${text#*waive}
			text=${text%%\*/*}
			text=$(sed -E 's/^[[:space:]]*(—|--|-|:)?[[:space:]]*//; s/[[:space:]]+$//' <<<"$text")
			printf '%s' "${text:-?}"	# "?": a waiver without a reason
			return
		fi
	done
}

shopt -s nullglob
files=()
for d in "${SCANNED_DIRS[@]}"; do
	files+=("$d"/*.c "$d"/*.h)
done

csv=$("$venv/bin/python" -m lizard -l cpp --csv "${files[@]}") || {
	echo "complexity: lizard failed" >&2
	exit 2
}

n_fail=0 n_waived=0 n_report=0
fail_lines=() waived_lines=() report_lines=()
# CSV: NLOC,CCN,token,PARAM,length,"location","file","name","long_name",start,end
# (long_name may hold commas; start and end are the last two fields.)
while IFS=$'\t' read -r ccn length file name start; do
	[ "$length" -gt "$MAX_LENGTH" ] || [ "$ccn" -gt "$MAX_CCN" ] || continue
	what="length $length"
	[ "$length" -gt "$MAX_LENGTH" ] && what+=" (>$MAX_LENGTH)"
	what+=", CCN $ccn"
	[ "$ccn" -gt "$MAX_CCN" ] && what+=" (>$MAX_CCN)"
	where="$file:$start $name"
	if ! is_gated "$file"; then
		report_lines+=("  report  $where: $what")
		n_report=$((n_report + 1))
		continue
	fi
	reason=$(waiver_of "$file" "$start")
	if [ -n "$reason" ] && [ "$reason" != "?" ]; then
		waived_lines+=("  waived  $where: $what — $reason")
		n_waived=$((n_waived + 1))
	else
		[ "$reason" = "?" ] && what+="; its waiver names no reason"
		fail_lines+=("  FAIL    $where: $what")
		n_fail=$((n_fail + 1))
	fi
done < <(awk -F, '{
	gsub(/"/, "", $7); gsub(/"/, "", $8)
	printf "%s\t%s\t%s\t%s\t%s\n", $2, $5, $7, $8, $(NF - 1)
}' <<<"$csv")

# "#lizard forgives" would take a gated function out of lizard's list before we see it.
forgiven=()
for f in "${files[@]}"; do
	is_gated "$f" || continue
	while IFS= read -r hit; do
		forgiven+=("  FAIL    $f:${hit%%:*}: \"#lizard forgive\" hides a function from the gate; use a waiver")
	done < <(grep -n '#lizard forgive' "$f" || true)
done
n_fail=$((n_fail + ${#forgiven[@]}))

echo "complexity: lizard $LIZARD_VERSION on ${SCANNED_DIRS[*]}: a function over $MAX_LENGTH lines (length) or CCN $MAX_CCN"
echo "  gated (fails): ${GATED_FILES[*]}"
for l in "${fail_lines[@]}" "${forgiven[@]}" "${waived_lines[@]}" "${report_lines[@]}"; do
	echo "$l"
done
echo "complexity: $n_fail gated violation(s), $n_waived waived, $n_report outside the gate (reported only)"
[ "$n_fail" -eq 0 ] || {
	echo "complexity: FAILED — split the function into named steps (docs/complexity.md), or waive it with a reason" >&2
	exit 1
}
