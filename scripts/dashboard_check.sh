#!/usr/bin/env bash
# burn-train's dashboard in a real terminal: builds `ember` with `--features dashboard`, runs the
# main job in a tmux pane, reads the screen back (capture-pane) and checks what it shows, then
# stops the run from the dashboard's menu (q, s) and, in a second run, with Ctrl-C; both must
# exit 130 with a checkpoint, the terminal back on the main screen, and the held messages and
# the last progress line printed. Then the text line with --no-dashboard, and the menu's kill.
#   bash scripts/dashboard_check.sh            (needs tmux; screens are kept in the printed folder)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v tmux >/dev/null || { echo "tmux is needed (apt-get install tmux)"; exit 2; }
cargo build --release --features dashboard --bin ember
work=$(mktemp -d)
cp target/release/ember "$work/ember"
term=ember-dashboard-$$
trap 'tmux kill-session -t "$term" 2>/dev/null || true' EXIT

# Starts the main job in a fresh pane; $1 names the run.
start() {
  tmux kill-session -t "$term" 2>/dev/null || true
  tmux new-session -d -s "$term" -x 150 -y 45 \
    "$work/ember train recipes/arithmetic-cpu.toml --out $work/$1 --set warmup.steps=100; echo EXIT=\$? > $work/$1.exit; sleep 600"
}

# Waits until the run has logged $2 rows (or exited).
wait_rows() {
  for _ in $(seq 1 600); do
    [ -f "$work/$1.exit" ] && break
    if [ -f "$work/$1/metrics.jsonl" ] && [ "$(wc -l < "$work/$1/metrics.jsonl")" -ge "$2" ]; then
      return 0
    fi
    sleep 0.5
  done
  echo "FAIL: $1 did not reach $2 rows"; tmux capture-pane -p -t "$term"; exit 1
}

wait_exit() {
  for _ in $(seq 1 600); do [ -f "$work/$1.exit" ] && return 0; sleep 0.5; done
  echo "FAIL: $1 did not exit"; exit 1
}

expect() { # $1 file, $2 pattern, $3 what
  if grep -qE "$2" "$1"; then echo "ok: $3"; else echo "FAIL: $3 ($2 not in $1)"; cat "$1"; exit 1; fi
}

# 1. The dashboard is up: the metrics' table, the label, the progress; then q, s.
start menu
wait_rows menu 30
sleep 1
tmux capture-pane -p -t "$term" > "$work/menu-live.txt"
expect "$work/menu-live.txt" "rollout/reward_mean │ eval/accuracy │ actor/" "the recipe's curves lead the plot tabs"
expect "$work/menu-live.txt" "Train [0-9.]+" "the metrics' latest values"
expect "$work/menu-live.txt" "arithmetic-cpu · q: stop or kill" "the run's label"
expect "$work/menu-live.txt" "Items *: *[0-9]+/300" "the progress counts the run's steps"
tmux send-keys -t "$term" q
sleep 0.5
tmux capture-pane -p -t "$term" > "$work/menu-popup.txt"
expect "$work/menu-popup.txt" "Stop the training" "q opens burn-train's menu"
tmux send-keys -t "$term" s
wait_exit menu
sleep 0.5
tmux capture-pane -p -t "$term" > "$work/menu-after.txt"
expect "$work/menu.exit" "EXIT=130" "s stops the run with exit 130"
expect "$work/menu-after.txt" "stopped after step [0-9]+; checkpoint" "the stop's message, after the dashboard"
expect "$work/menu-after.txt" "\[arithmetic-cpu\] step +[0-9]+/300" "the last progress line"
ls "$work/menu/checkpoints" | grep -q step || { echo "FAIL: no checkpoint"; exit 1; }
echo "ok: a checkpoint was written"

# 2. Ctrl-C reaches the run inside the dashboard (raw mode with the terminal's signals on).
start ctrlc
wait_rows ctrlc 30
tmux send-keys -t "$term" C-c
sleep 1
tmux capture-pane -p -t "$term" > "$work/ctrlc-live.txt"
expect "$work/ctrlc-live.txt" "stopping after this step" "the label shows the stop"
wait_exit ctrlc
tmux capture-pane -p -t "$term" > "$work/ctrlc-after.txt"
expect "$work/ctrlc.exit" "EXIT=130" "Ctrl-C stops the run with exit 130"
expect "$work/ctrlc-after.txt" "Ctrl-C: stopping after this step" "the signal's notice, held until the dashboard closed"
expect "$work/ctrlc-after.txt" "stopped after step [0-9]+; checkpoint" "the stop's message"

# 3. Resumed with --no-dashboard, two more steps: the text line.
last=$(ls "$work/menu/checkpoints" | grep -o '[0-9]*$' | sort -n | tail -1)
next=$((10#$last + 1))
"$work/ember" train recipes/arithmetic-cpu.toml --out "$work/menu" --set warmup.steps=100 \
  --resume --no-dashboard --stop-after $((next + 1)) > "$work/text.txt" 2>&1 || true
expect "$work/text.txt" "step +$next/300" "--no-dashboard keeps the progress line"
# 4. The menu's kill (q, k): exit 130 at once, no checkpoint of the step, the terminal back.
start kill
wait_rows kill 5
tmux send-keys -t "$term" q
sleep 0.5
tmux send-keys -t "$term" k
wait_exit kill
tmux capture-pane -p -t "$term" > "$work/kill-after.txt"
expect "$work/kill.exit" "EXIT=130" "k exits with 130"
expect "$work/kill-after.txt" "killed from the dashboard: exiting without a checkpoint" "the kill's message on the main screen"
echo "all checks passed; screens in $work"
