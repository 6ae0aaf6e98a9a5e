#!/usr/bin/env bash
# The guest's disk for scripts/vm-test.sh: Debian trixie from Debian's mirror (mmdebstrap), the kernel asked
# for (6.12: trixie's; 6.1: bookworm's, Amazon Linux 2023's line), the Debian packages `setup.sh --test`
# installs (apt at the host's speed, not the guest's), systemd-networkd on QEMU's user network, the 9p share
# mounted at /mnt/share, and the unit that runs the share's guest.sh at boot. vm-test.sh caches the result by a
# hash of this file, the unit and setup.sh: a change to how a run goes does not rebuild the image.
#
#   bash scripts/vm/image.sh ARCH KERNEL DIR       (writes DIR/root.img, DIR/vmlinuz, DIR/initrd.img)
#   bash scripts/vm/image.sh ARCH KERNEL --describe (what it would build, in one line)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ARCH=$1 KERNEL=$2 IMAGE=$3
MIRROR=${SANDBOXD_VM_MIRROR:-http://deb.debian.org/debian}
case $KERNEL in
  6.12) KPKG=linux-image-$ARCH SOURCES=("deb $MIRROR trixie main") ;;
  6.1) KPKG=linux-image-$ARCH/bookworm SOURCES=("deb $MIRROR trixie main" "deb $MIRROR bookworm main") ;;
  *) echo "image.sh: kernel 6.12 or 6.1, not $KERNEL" >&2; exit 2 ;;
esac
if [[ $IMAGE == --describe ]]; then echo "trixie, $KPKG"; exit 0; fi
BASE=systemd-sysv,udev,kmod,initramfs-tools,python3,python3-venv,python3-dev,iproute2,ca-certificates,curl,git,procps,psmisc
mkdir -p "$IMAGE"
tree=$IMAGE/rootfs
cp "$ROOT/scripts/setup.sh" "$IMAGE/setup.sh"
mmdebstrap --variant=minbase --arch="$ARCH" --include="$BASE,$KPKG" \
  --customize-hook='cp "'"$IMAGE"'/setup.sh" "$1/tmp/setup.sh"' \
  --customize-hook='chroot "$1" bash -c "set -e; pkgs=\$(bash /tmp/setup.sh --test --print-packages); apt-get install -y -qq --no-install-recommends \$pkgs"' \
  --customize-hook='rm "$1/tmp/setup.sh"; echo sandboxd-vm > "$1/etc/hostname"' \
  --customize-hook='echo "nameserver 10.0.2.3" > "$1/etc/resolv.conf"' \
  --customize-hook='printf "[Match]\nName=en* eth*\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\nDNS=10.0.2.3\n" > "$1/etc/systemd/network/10-slirp.network"' \
  --customize-hook='chroot "$1" systemctl enable systemd-networkd' \
  --customize-hook='printf "/dev/vda / ext4 rw,relatime 0 1\nshare /mnt/share 9p trans=virtio,version=9p2000.L,msize=524288 0 0\n" > "$1/etc/fstab"; mkdir -p "$1/mnt/share"' \
  --customize-hook='cp "'"$ROOT"'/scripts/vm/sandboxd-vm-test.service" "$1/etc/systemd/system/"; chroot "$1" systemctl enable sandboxd-vm-test.service' \
  --customize-hook='printf "9p\n9pnet\n9pnet_virtio\n" >> "$1/etc/initramfs-tools/modules"; chroot "$1" update-initramfs -u -k all' \
  trixie "$tree" "${SOURCES[@]}"
cp -L "$tree/vmlinuz" "$IMAGE/vmlinuz" && cp -L "$tree/initrd.img" "$IMAGE/initrd.img"
truncate -s 24G "$IMAGE/root.img.part" && mkfs.ext4 -q -L root -d "$tree" "$IMAGE/root.img.part"
rm -rf "$tree" "$IMAGE/setup.sh" && mv "$IMAGE/root.img.part" "$IMAGE/root.img"
