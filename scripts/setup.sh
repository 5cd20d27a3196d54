#!/usr/bin/env bash
# fabriclab set-up: one idempotent script used by the README, by .ci/run and by the Vagrantfile.
#
#   sudo scripts/setup.sh            install packages, start Open vSwitch, create .venv, install fabriclab
#   sudo scripts/setup.sh --test     the same, plus the test tools (pytest, vagrant for `vagrant validate`,
#                                    PyTorch's CPU wheel for the `fabriclab record` test)
#
# Open vSwitch: if the `openvswitch` kernel module loads, the kernel datapath is used; otherwise
# ovs-vswitchd serves userspace (netdev) bridges. fabric.emulation probes the same way at run time.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FABRICLAB_VENV:-$here/.venv}"
want_test=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    *) echo "setup.sh: unknown option '$arg' (known: --test)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: must run as root (it installs packages and starts Open vSwitch); try: sudo $0 $*" >&2
  exit 1
fi

log() { printf '[setup] %s\n' "$*"; }

# 1. Debian/Ubuntu packages ---------------------------------------------------------------------
packages=(openvswitch-switch mininet iperf3 iputils-ping fping ethtool tcpdump iproute2 procps
          python3 python3-venv python3-pip)
[ "$want_test" -eq 1 ] && packages+=(vagrant chromium)  # chromium: tests/test_compare_page.py loads compare.html
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "packages present"
fi

# 2. Open vSwitch daemons -----------------------------------------------------------------------
rundir=/var/run/openvswitch
mkdir -p "$rundir" /var/log/openvswitch /etc/openvswitch
userspace=0
if modprobe -q openvswitch 2>/dev/null; then
  log "openvswitch kernel module loaded: kernel datapath available"
else
  log "no openvswitch kernel module: bridges will use the userspace (netdev) datapath"
  userspace=1
  # The userspace datapath sends the packets of every switch port through ONE AF_PACKET socket of
  # ovs-vswitchd, whose send buffer (net.core.wmem_default when it is created, 208 KB) bounds what all
  # ports' queues hold together: beyond ~140 full-size frames fabric-wide OVS drops packets ("error
  # sending Ethernet packet: Resource temporarily unavailable"). Measured: an all-to-all on pyramid-16
  # lost packets to 127 TCP timeouts per host. A 4 MB default gives each port its qdisc's own limit.
  sysctl -qw net.core.wmem_default=4194304
  if ovs-appctl -t ovs-vswitchd version >/dev/null 2>&1; then
    # No packet socket yet (a daemon that has sent on no netdev port) is no answer, not an error: OVS
    # makes the socket at its first send, with the default set above. `|| true` keeps pipefail from
    # ending the script.
    tb=$(ss -0 -a -m -p 2>/dev/null | grep -A0 '"ovs-vswitchd"' | grep -o 'tb[0-9]*' | head -n1 | tr -d tb || true)
    if [ -n "$tb" ] && [ "$tb" -lt 4194304 ] && [ -f "$rundir/ovs-vswitchd.pid" ]; then
      log "restarting ovs-vswitchd: its packet socket's send buffer is ${tb} bytes"
      ovs-appctl -t ovs-vswitchd exit >/dev/null 2>&1 || true
      for _ in $(seq 50); do ovs-appctl -t ovs-vswitchd version >/dev/null 2>&1 || break; sleep 0.1; done
    fi
  fi
fi
if ovs-vsctl --timeout=2 show >/dev/null 2>&1 && [ -S "$rundir/db.sock" ] \
   && ovs-appctl -t ovs-vswitchd version >/dev/null 2>&1; then
  log "ovsdb-server and ovs-vswitchd already running"
else
  # systemd hosts (Ubuntu/Vagrant) normally run them as a service; try that first.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl start openvswitch-switch >/dev/null 2>&1 || true
  fi
  if ! ovs-appctl -t ovs-vswitchd version >/dev/null 2>&1; then
    db=/etc/openvswitch/conf.db
    schema=/usr/share/openvswitch/vswitch.ovsschema
    [ -f "$db" ] || ovsdb-tool create "$db" "$schema"
    if ovsdb-tool needs-conversion "$db" "$schema" 2>/dev/null | grep -q yes; then
      ovsdb-tool convert "$db" "$schema"
    fi
    if ! ovs-appctl -t ovsdb-server version >/dev/null 2>&1; then
      log "starting ovsdb-server"
      ovsdb-server "$db" --remote=punix:"$rundir/db.sock" \
        --remote=db:Open_vSwitch,Open_vSwitch,manager_options \
        --pidfile="$rundir/ovsdb-server.pid" --detach --log-file=/var/log/openvswitch/ovsdb-server.log
    fi
    ovs-vsctl --no-wait init
    log "starting ovs-vswitchd"
    ovs-vswitchd --pidfile="$rundir/ovs-vswitchd.pid" --detach \
      --log-file=/var/log/openvswitch/ovs-vswitchd.log
  fi
  ovs-vsctl --timeout=10 show >/dev/null
  log "Open vSwitch $(ovs-vswitchd --version | head -n1 | awk '{print $NF}') running"
fi

# 3. Python environment that sees the distribution's Mininet ------------------------------------
# Debian's mininet installs into the system Python, so the venv is made from /usr/bin/python3
# with --system-site-packages. pip brings fabriclab's dependencies, Ray among them (compare's rows run as Ray
# tasks: `ray[default]`, wheels for CPython 3.11 on x86_64).
if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
extras="."
[ "$want_test" -eq 1 ] && extras=".[test,record]"
log "installing fabriclab into $venv"
"$venv/bin/pip" install -q --disable-pip-version-check -e "$here/$extras"
"$venv/bin/python" -c "import mininet.net, os_ken, ray, fabric, controller, traffic, fabriclab" \
  || { echo "setup.sh: the environment cannot import mininet/os_ken/ray/fabriclab" >&2; exit 1; }
log "ready: $venv/bin/fabriclab"
