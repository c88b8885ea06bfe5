#!/usr/bin/env bash
# The docs stay true: every ```console block of README.md and docs/*.md is
# run. A line "$ CMD" runs CMD with bash in the repository root, with the
# build's programs first on PATH (`shardtrain` is build/bin/shardtrain); it
# must exit 0, or N when the line ends with "# exit N". The lines after it,
# up to the next "$", must each appear in its output (stdout and stderr, as
# whole lines, trailing spaces ignored); "..." stands for lines not shown.
# Every relative link must name an existing file. Then the quick start's
# first command, `scripts/demo`, runs with a short job (--set steps=10): it
# must train, plot and sample. (The second, scripts/test, is what runs this.)
# Other code blocks (deployment, TLS setup) are illustrations; the deploy
# tests run what they show.
#   doc_commands_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
cd "$src" || exit 1
export PATH="$build/bin:$PATH"
failed=0 ran=0
out=$(mktemp) expect=$(mktemp) stripped=$(mktemp)
trap 'rm -f "$out" "$expect" "$stripped"' EXIT

check() {  # file command expected_exit
  local file=$1 cmd=$2 want=$3
  ran=$((ran + 1))
  bash -c "$cmd" >"$out" 2>&1 </dev/null
  local rc=$?
  local bad="" line
  [ "$rc" = "$want" ] || bad="exit $rc, want $want"
  # The output without trailing spaces, once, in a file: grep -q on a pipe
  # would stop reading at its match, and under pipefail the writer's SIGPIPE
  # on a long output read as a missing line.
  sed 's/[[:space:]]*$//' "$out" >"$stripped"
  while IFS= read -r line; do
    [ "$line" = "..." ] && continue
    [ -z "$line" ] && continue
    if ! grep -qxF -- "$(echo "$line" | sed 's/[[:space:]]*$//')" "$stripped"; then
      bad="${bad:+$bad; }missing line: $line"
    fi
  done <"$expect"
  if [ -n "$bad" ]; then
    failed=1
    echo "FAIL  $file: \$ $cmd"
    echo "      $bad"
    sed 's/^/      | /' "$out" | tail -n 20
  else
    echo "ok    $file: \$ $cmd"
  fi
}

for file in README.md docs/*.md; do
  in_block=0 cmd=""
  : >"$expect"
  while IFS= read -r line || [ -n "$line" ]; do
    if [ $in_block = 0 ]; then
      [ "$line" = '```console' ] && in_block=1 && cmd="" && : >"$expect"
      continue
    fi
    if [ "$line" = '```' ] || [ "${line:0:2}" = '$ ' ]; then
      if [ -n "$cmd" ]; then
        want=0
        if [[ $cmd =~ \#\ exit\ ([0-9]+)[[:space:]]*$ ]]; then want=${BASH_REMATCH[1]}; fi
        check "$file" "$cmd" "$want"
      fi
      cmd="" && : >"$expect"
      if [ "$line" = '```' ]; then in_block=0; else cmd=${line:2}; fi
      continue
    fi
    echo "$line" >>"$expect"
  done <"$file"
done

# Every relative link of the documents points at a file that exists.
for file in README.md docs/*.md; do
  dir=$(dirname "$file")
  for target in $(grep -o '](\([^)#:]*\)[#)]' "$file" | sed 's/^](//; s/[#)]$//'); do
    ran=$((ran + 1))
    if [ ! -e "$dir/$target" ]; then
      failed=1
      echo "FAIL  $file: link to $target, which does not exist"
    fi
  done
done

# The quick start's demo, shortened.
ran=$((ran + 1))
if demo=$(timeout 600 scripts/demo --set steps=10 2>&1) &&
  grep -q 'SUCCEEDED after 10 steps' <<<"$demo" && grep -q '^ *\* loss$' <<<"$demo"; then
  echo "ok    README.md: scripts/demo --set steps=10 (trained, plotted, sampled)"
else
  failed=1
  echo "FAIL  README.md: scripts/demo --set steps=10"
  tail -n 30 <<<"$demo" | sed 's/^/      | /'
fi
echo "doc commands: $ran run, $([ $failed = 0 ] && echo all passed || echo some FAILED)"
exit $failed
