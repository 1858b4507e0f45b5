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
set -uo pipefail

claims=/run/warren-claims
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
	# Deepest mounts first; lazily, as a dead runtime may hold them busy.
	findmnt -rn -o TARGET | awk -v d="$dir" '$0 == d || index($0, d "/") == 1' | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null
	done
	rm -rf --one-file-system "$dir" "$dir.img" && echo "sweep: removed $dir (its server, pid $pid, is gone)"
done
exit 0
