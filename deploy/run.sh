#!/usr/bin/env bash
# make run: a gzramd on the embedded defaults, its socket in a temporary
# directory (removed when it stops), until Ctrl-C.
# Usage: deploy/run.sh BIN/gzramd
set -u
gzramd=$1
dir=$(mktemp -d /tmp/gzramd.XXXXXX) || exit
sock=$dir/gzramd.sock
notice=
trap '[ -z "$notice" ] || kill "$notice" 2>/dev/null; rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM

# `gzramd status` reads 127.0.0.1:9829 unless told another: that where it
# is free, so the command is the plain one; else the next free port.
metrics=127.0.0.1:0
for port in $(seq 9829 9849); do
	if ! (: </dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
		metrics=127.0.0.1:$port
		break
	fi
done
case $metrics in
127.0.0.1:9829) cmd="$gzramd status" ;;
127.0.0.1:0) cmd="$gzramd status --metrics 127.0.0.1:PORT (PORT as the 'serving metrics' line says)" ;;
*) cmd="$gzramd status --metrics $metrics" ;;
esac

# What to do with it, printed once it serves, below its start-up log
# (which ends a moment after the socket appears), not above, off screen.
{
	until [ -S "$sock" ]; do sleep 0.2; done
	sleep 1
	echo "gzramd: serving; connect with: nbdinfo 'nbd+unix:///gzram0?socket=$sock'"
	command -v nbdinfo >/dev/null || echo "gzramd: nbdinfo is not installed (Debian package libnbd-bin: apt-get install libnbd-bin)"
	echo "gzramd: its status: $cmd"
	echo "gzramd: Ctrl-C stops it"
} &
notice=$!
echo "gzramd: starting $gzramd serve (1 GiB, backend auto); Ctrl-C stops it"

# Job control (below) takes the terminal: only where make has it, not
# for make run & or without a terminal.
read -r _ _ _ _ pgrp _ _ tpgid _ </proc/$$/stat
if [ ! -t 0 ] || [ "$pgrp" != "$tpgid" ]; then
	"$gzramd" serve --socket "$sock" --metrics "$metrics"
	exit
fi
# On the terminal, in the foreground: Ctrl-C must reach gzramd alone. Make
# kills itself with the SIGINT it gets (status 130, "make: *** Error
# 130") whatever its recipe does; with job control gzramd is a job of its
# own, the terminal's foreground, and make sees only this script end, with
# gzramd's status: 0 when it stopped clean.
set -m
"$gzramd" serve --socket "$sock" --metrics "$metrics"
status=$?
# Ctrl-Z stopped it: a device's server left stopped stalls the device's
# users (swap, were it swap), and this script could not clean up after
# it, so it goes on.
while [ "$status" -gt 128 ] && jobs %% >/dev/null 2>&1; do
	echo "gzramd: not suspended: Ctrl-C stops it"
	fg >/dev/null
	status=$?
done
exit "$status"
