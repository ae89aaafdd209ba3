#!/usr/bin/env bash
# Packs a build's binaries and any number of variant builds (scripts/variant_build.sh) for one
# device call. A variant differs from the base in one or a few kernels, so it travels as a zstd
# delta against the base (~0.1-0.4 MB instead of ~8 MB compressed): a call can then time a dozen
# variants side by side within the 64 MiB it carries.
# Usage, here:        scripts/device_pack.sh pack OUT BASE_BUILD_DIR [NAME=VARIANT_DIR]...
#         on the GPU: OUT/unpack.sh            (binaries into OUT/bin/base and OUT/bin/NAME)
# then BIN=OUT/bin/NAME for scripts/device_run.sh. The CLI and the GPU test binary are packed where
# present (a variant built with --tests has both). The device image may lack zstd and the OpenSSL
# library the CLI links, so both travel too.
set -euo pipefail
[[ "${1:-}" == pack && $# -ge 3 ]] || { sed -n '2,10p' "$0" >&2; exit 2; }
out=$(realpath -m "$2") base=$(realpath "$3")
shift 3
command -v zstd >/dev/null || { echo "device_pack: zstd is needed (apt-get install zstd)" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out/stage/base" "$out/stage/lib"
binaries=(nvfp4mla tests/nvfp4mla_gpu_tests)
for b in "${binaries[@]}"; do
  [[ -f "$base/$b" ]] && cp "$base/$b" "$out/stage/base/" && strip "$out/stage/base/$(basename "$b")"
done
cp "$(ldd "$base/nvfp4mla" | awk '/libcrypto/ {print $3}')" "$out/stage/lib/"
tar -C "$out/stage" -cf - base lib | xz -3 -T0 >"$out/base.tar.xz"
for spec in "$@"; do
  name=${spec%%=*} dir=$(realpath "${spec#*=}")
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ && "$name" != base ]] || { echo "device_pack: bad variant name '$name'" >&2; exit 1; }
  for b in "${binaries[@]}"; do
    f="$dir/$(basename "$b")"
    [[ -f "$f" ]] || continue
    cp "$f" "$out/stage/variant" && strip "$out/stage/variant"
    # (zstd prints tuning notes for large patches on stderr; they are kept only if it fails)
    zstd -q -19 --long=27 --patch-from="$out/stage/base/$(basename "$b")" "$out/stage/variant" \
      -o "$out/${name}__$(basename "$b").zst" 2>"$out/stage/zstd.log" || { cat "$out/stage/zstd.log" >&2; exit 1; }
  done
done
cp "$(command -v zstd)" "$out/zstd"
rm -rf "$out/stage"
cat >"$out/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# Unpacks device_pack.sh's archive next to this script: bin/base, bin/<variant>, bin/lib.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p bin && tar -xJf base.tar.xz -C bin
for patch in *__*.zst; do
  [[ -f "$patch" ]] || continue
  stem=${patch%.zst} name=${patch%%__*}
  mkdir -p "bin/$name"
  ./zstd -q -d --long=27 --patch-from="bin/base/${stem#*__}" "$patch" -o "bin/$name/${stem#*__}"
  chmod +x "bin/$name/${stem#*__}"
done
echo "unpacked: $(ls bin | tr '\n' ' ')(export LD_LIBRARY_PATH=$PWD/bin/lib)"
EOF
chmod +x "$out/unpack.sh"
echo "device_pack: $(du -sh "$out" | cut -f1) in $out: base$(printf ' %s' "${@%%=*}")"
