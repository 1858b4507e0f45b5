#!/usr/bin/env bash
# Removes the data dirs that test servers of an earlier, killed test run
# left in /tmp or /var/tmp (a run stopped by a timeout or a reboot of the
# session). A server refuses to take a network prefix or cgroup parent
# whose last user's data dir still exists while that user's sandboxes
# remain on the host (their owner could adopt them). Once the dead test
# server's data dir is gone, the next server with those names removes
# what it left as leftovers. Only data dirs whose claim (in
# /run/warren-claims) names a server process that is no longer alive are
# touched: a test server of another checkout that is running is kept.
#
# It also stops and removes the PostgreSQL servers of killed chaos runs
# and scale tests (/tmp/warren-chaos-pg-*, /tmp/warren-scale-pg-*) and the
# loop-mounted node disks of killed chaos runs (/tmp/warren-chaos-disk-*):
# each holds an owner file ("pid starttime" of the run that made it), and
# only those whose owner is no longer running are touched.
set -uo pipefail

claims=/run/warren-claims

# owner_gone dir: does dir's owner file name a process that is gone (or
# a later process that reuses its pid)? No owner file: not known, kept.
owner_gone() {
	local pid start now state
	[ -r "$1/owner" ] || return 1
	read -r pid start <"$1/owner" || return 1
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	[ -r "/proc/$pid/stat" ] || return 0
	read -r state now < <(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $1, $20}')
	[ "$state" = Z ] && return 0 # killed, not yet reaped
	[ -n "$start" ] && [ "$start" != "$now" ]
}

unmount_below() { # dir: deepest mounts first; lazily, as a dead runtime may hold them busy
	findmnt -rn -o TARGET | awk -v d="$1" '$0 == d || index($0, d "/") == 1' | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null
	done
}

for dir in /tmp/warren-chaos-pg-* /tmp/warren-scale-pg-*; do
	[ -d "$dir" ] || continue
	owner_gone "$dir" || continue
	pm=$(head -n1 "$dir/data/postmaster.pid" 2>/dev/null)
	if [[ "$pm" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pm/cmdline" 2>/dev/null | grep -q "postgres.*$dir/data"; then
		kill -QUIT "$pm" 2>/dev/null # immediate shutdown
		for _ in $(seq 50); do [ -e "/proc/$pm" ] || break; sleep 0.2; done
	fi
	rm -rf --one-file-system "$dir" && echo "sweep: stopped and removed the PostgreSQL server in $dir (its run is gone)"
done

for dir in /tmp/warren-chaos-disk-*; do
	[ -d "$dir" ] || continue
	owner_gone "$dir" || continue
	# A node server of the dead run that still runs on it keeps it.
	pgrep -f -- "--data-dir $dir/" >/dev/null && continue
	unmount_below "$dir"
	rm -rf --one-file-system "$dir" && rm -f "$dir.img" && echo "sweep: removed the chaos node disk $dir (its run is gone)"
done

[ -d "$claims" ] || exit 0

alive() { # pid: a running warren serve?
	[ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q 'warren.* serve '
}

for f in "$claims"/data-dir-*.lock; do
	[ -s "$f" ] || continue
	record=$(head -c 4096 "$f")
	pid=$(sed -n 's/.*(pid \([0-9]*\),.*/\1/p' <<<"$record")
	dir=$(sed -n 's/.*data dir \([^)]*\)).*/\1/p' <<<"$record")
	case "$dir" in
	/tmp/warren-e2e-* | /tmp/warren-sec-data-* | /var/tmp/warren-e2e-* | /var/tmp/warren-sec-data-*) ;;
	*) continue ;;
	esac
	[ -n "$pid" ] && alive "$pid" && continue
	[ -e "$dir" ] || continue
	unmount_below "$dir"
	rm -rf --one-file-system "$dir" "$dir.img" && echo "sweep: removed $dir (its server, pid $pid, is gone)"
done
exit 0
