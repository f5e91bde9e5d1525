# Shared by recipes/demo.sh and recipes/demo_agent.sh (sourced, not run): the knob check and `phase`.
#
# demo_start OUT KNOBS: same knobs as the last run in OUT, keep its finished phases (an interrupted one resumes
#   from its newest checkpoint); other knobs, start over in a clean folder (no stale checkpoints).
# phase NAME COMMAND...: run one phase unless an earlier run with the same knobs finished it; record its wall time
#   in $OUT/.done-NAME.

demo_start() {
  OUT=$1
  local knobs=$2
  if [[ -f "$OUT/knobs" && "$(cat "$OUT/knobs")" != "$knobs" ]]; then
    echo "demo knobs changed ($(cat "$OUT/knobs") -> $knobs): starting over in $OUT"
    rm -rf "$OUT"
  fi
  mkdir -p "$OUT"
  echo "$knobs" > "$OUT/knobs"
}

phase() {
  local name=$1 start=$SECONDS
  shift
  if [[ -f "$OUT/.done-$name" ]]; then
    printf '\n==== [%s] finished by an earlier run with the same knobs, skipped\n' "$name"
    return
  fi
  printf '\n==== [%s] %s\n' "$name" "$*"
  "$@"
  printf '%s\t%s\n' "$name" "$((SECONDS - start))" > "$OUT/.done-$name"
}
