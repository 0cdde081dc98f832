#!/bin/sh
# Regenerates fuzz/seeds/ (small valid images) with erofs-utils' mkfs.erofs.
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t="$tmp/tree"
mkdir -p "$t/sub/deeper"
printf hello > "$t/file"
head -c 5000 /dev/zero | tr '\0' 'x' > "$t/tail"
printf 'x%.0s' $(seq 4096) > "$t/block"
ln -s file "$t/link"
ln "$t/file" "$t/hard"
mkfifo "$t/fifo"
printf inner > "$t/sub/deeper/inner"
setfattr -n user.foo -v bar "$t/file" 2>/dev/null || true
setfattr -n user.common -v shared "$t/tail" 2>/dev/null || true
setfattr -n user.common -v shared "$t/block" 2>/dev/null || true
setfattr -n user.common -v shared "$t/sub" 2>/dev/null || true
setfattr -n user.common -v shared "$t/link" 2>/dev/null || true
setfacl -m u:1234:rwx "$t/block" 2>/dev/null || true
setfattr -n trusted.overlay.redirect -v /a "$t/sub" 2>/dev/null || true
setfattr -n trusted.overlay.redirect -v /b "$t/many" 2>/dev/null || true
mkdir "$t/many"
i=0
while [ $i -lt 120 ]; do
  : > "$t/many/entry-$i-padding-to-fill-blocks"
  # Enough trusted.overlay.* names for verilay's builder to store a long prefix (needs root).
  if [ $((i % 8)) -eq 0 ]; then
    setfattr -n trusted.overlay.redirect -v "/obj/$i" "$t/many/entry-$i-padding-to-fill-blocks" 2>/dev/null || true
  fi
  i=$((i + 1))
done
mkdir -p seeds
mkfs.erofs --quiet -T1600000000 seeds/default.img "$t"
mkfs.erofs --quiet -T1600000000 -Enoinline_data seeds/noinline.img "$t"
mkfs.erofs --quiet -T1600000000 --chunksize=4096 seeds/chunks4.img "$t"
mkfs.erofs --quiet -T1600000000 --chunksize=8192 -Eforce-chunk-indexes seeds/chunks8.img "$t"
mkfs.erofs --quiet seeds/extended.img "$t"
# verilay's own builder: xattr name filters, long prefixes, small and large blocks.
if command -v cargo >/dev/null 2>&1; then
  for bs in 512 4096; do
    cargo run -q -p verilay --manifest-path ../Cargo.toml -- build -q -b "$bs" --mtime 1600000000 \
      --build-time 1600000000 -o "seeds/verilay-$bs.img" "$t"
  done
fi
ls -l seeds
