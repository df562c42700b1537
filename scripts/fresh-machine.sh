#!/usr/bin/env bash
# Times make targets on a fresh Debian 12, as docs/performance.md's newcomer figures were taken (root):
#   scripts/fresh-machine.sh DIR 'make demo' 'make demo'     # each command timed, in order
#   scripts/fresh-machine.sh DIR 'make test'                 # again in the machine DIR holds
#   scripts/fresh-machine.sh --clean DIR                     # unmount and remove DIR
# DIR becomes a Debian 12 minbase chroot (mmdebstrap, or debootstrap, from the bookworm mirror
# this machine's own apt uses — /etc/apt/sources.list, sources.list.d/*.list and deb822 *.sources —
# or $MIRROR) with git and make only — a newcomer's machine before anything of ours — holding a clone of this
# repository's HEAD at /root/gpufence; /proc, /sys and /dev are mounted in (slave mounts: nothing
# unmounted inside reaches the host). The base tarball is kept in $FRESH_TAR for the next run.
set -euo pipefail

FRESH_TAR=${FRESH_TAR:-/var/tmp/gpufence-fresh-bookworm.tar}

# The first enabled `deb` source of suite bookworm in this machine's apt configuration, in apt's
# order: sources.list, then sources.list.d/ by name; one-line `.list` entries
# (`deb [options] URI bookworm ...`) and deb822 `.sources` stanzas (Types/URIs/Suites/Enabled).
host_mirror() {
  local etc=${APT_ETC:-/etc/apt} f m
  for f in "$etc/sources.list" "$etc"/sources.list.d/*; do
    [ -f "$f" ] || continue
    case $f in
      */sources.list | *.list)
        m=$(awk '$1 == "deb" {
            i = 2
            if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            if ($(i + 1) == "bookworm") { print $i; exit }
          }' "$f") ;;
      *.sources)
        m=$(awk '
          function flush() {
            if (!found && types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ &&
                enabled != "no" && split(uris, u, " ") > 0) { print u[1]; found = 1 }
            types = suites = uris = key = ""; enabled = "yes"
          }
          BEGIN { enabled = "yes" }
          /^#/ { next }
          /^[ \t]*$/ { flush(); next }
          /^[ \t]/ { if (key == "uris") uris = uris " " $0; else if (key == "suites") suites = suites " " $0; next }
          {
            key = tolower(substr($0, 1, index($0, ":") - 1))
            val = substr($0, index($0, ":") + 1)
            gsub(/^[ \t]+|[ \t]+$/, "", val)
            if (key == "types") types = val
            else if (key == "uris") uris = val
            else if (key == "suites") suites = val
            else if (key == "enabled") enabled = tolower(val)
          }
          END { flush() }' "$f") ;;
      *) m= ;;
    esac
    [ -n "$m" ] && { echo "$m"; return 0; }
  done
  return 1
}

unmount() {
  local d=$1 m
  # deepest first; every mount below DIR
  for m in $(findmnt -rn -o TARGET | grep -F "$(readlink -f "$d")/" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  ! mountpoint -q "$d" || umount -l "$d"
}

if [ "${1:-}" = --clean ]; then
  d=${2:?usage: fresh-machine.sh --clean DIR}
  unmount "$d"
  rm -rf --one-file-system "$d"
  exit 0
fi

d=${1:?usage: fresh-machine.sh DIR COMMAND...}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }

if [ ! -s "$FRESH_TAR" ]; then
  MIRROR=${MIRROR:-$(host_mirror)} || {
    echo "no bookworm \`deb\` source in ${APT_ETC:-/etc/apt}/sources.list{,.d}: set MIRROR to a Debian mirror" >&2
    exit 1
  }
  if command -v mmdebstrap >/dev/null; then
    mmdebstrap --variant=minbase --include=git,make bookworm "$FRESH_TAR" "$MIRROR"
  else
    tmp=$(mktemp -d /var/tmp/fresh.XXXXXX)
    debootstrap --variant=minbase --include=git,make bookworm "$tmp" "$MIRROR"
    tar -C "$tmp" -cf "$FRESH_TAR" . && rm -rf --one-file-system "$tmp"
  fi
fi
if [ -d "$d/root/gpufence" ]; then
  echo ">> $d: entering the machine an earlier run left (what it installed and built stays)"
else
  mkdir -p "$d"
  tar -C "$d" -xf "$FRESH_TAR"
  # This machine's network set-up: its resolver, and where TLS goes through an inspecting proxy,
  # the local CA certificates that proxy needs (ca-certificates' postinst adds them once apt-get
  # installs it) and pip's pointer to the system bundle.
  cp /etc/resolv.conf "$d/etc/resolv.conf"
  for f in /usr/local/share/ca-certificates/*.crt /etc/pip.conf; do
    [ -f "$f" ] && { mkdir -p "$d$(dirname "$f")"; cp "$f" "$d$f"; }
  done
  git clone -q "$repo" "$d/root/gpufence"
fi

# The root a mount point of its own, as on a machine: runc makes "/" a slave mount (MS_REC |
# MS_SLAVE on "/"), which fails with EINVAL where "/" is a plain directory.
mount --bind "$d" "$d"
mount --make-private "$d"
mount -t proc proc "$d/proc"
for m in sys dev; do
  mount --rbind "/$m" "$d/$m"
  mount --make-rslave "$d/$m"
done
trap 'unmount "$d"' EXIT

for cmd in "$@"; do
  echo ">> [$(date +%T)] $cmd   (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  start=$(date +%s.%N)
  rc=0
  chroot "$d" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /root/gpufence && $cmd" || rc=$?
  end=$(date +%s.%N)
  printf '>> %s: exit %d, %s s (load after: %s)\n' "$cmd" "$rc" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')" "$(cut -d' ' -f1-3 /proc/loadavg)"
  [ "$rc" = 0 ] || exit "$rc"
done
