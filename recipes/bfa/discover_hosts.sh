#!/bin/sh
# Host discovery for elastic training (horovodrun --host-discovery-script; run.sh --discovery):
# prints the hosts workers may run on, one "host:slots" line each, from a hosts file that you edit
# while the job runs: add a line to let the job grow onto a host, delete one to take the host away.
#   file: $BFA_HOSTS_FILE, or hosts.txt next to this script
#   lines: "host:slots" or "host" (1 slot); blank lines and "# comments" are skipped
# Horovod runs this every second; a missing file means no hosts (yet).
f=${BFA_HOSTS_FILE:-$(dirname "$0")/hosts.txt}
[ -f "$f" ] || exit 0
sed -e 's/#.*//' -e 's/[[:space:]]//g' "$f" | awk -F: 'NF == 1 && $1 != "" { print $1 ":1"; next } NF == 2 { print }'
