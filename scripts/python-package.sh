#!/usr/bin/env bash
# The Python package (python/nvfp4mla, pure Python over build/libnvfp4mla_c.so).
#   scripts/python-package.sh             makes `import nvfp4mla` work for this user's python3 (a .pth
#                                         file in its user site-packages: no pip, nothing copied, the
#                                         package is used from this tree), then runs the package's
#                                         tests (the GPU ones skip without torch and a device)
#   scripts/python-package.sh --sanitize  the tests against build-asan's library, the sanitizer
#                                         runtimes preloaded into python3 (CLI comparisons skipped)
# Run after the build (scripts/test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
sanitize=0
[[ "${1:-}" == "--sanitize" ]] && sanitize=1
lib=$root/build/libnvfp4mla_c.so
((sanitize)) && lib=$root/build-asan/libnvfp4mla_c.so
[[ -f $lib ]] || { echo "python-package: $lib is missing: build first" >&2; exit 1; }

if ((!sanitize)); then
  site=$(python3 -c 'import site; print(site.getusersitepackages() if site.ENABLE_USER_SITE else "")')
  if [[ -n "$site" ]]; then
    mkdir -p "$site"
    echo "$root/python" >"$site/nvfp4mla.pth"
    echo "python-package: python3 imports nvfp4mla from $root/python (via $site/nvfp4mla.pth)"
  else
    echo "python-package: python3 has no user site-packages (a virtual environment?): use PYTHONPATH=$root/python"
  fi
fi

# The tests need numpy and pytest (Debian: python3-numpy, python3-pytest). A python3 earlier on the
# PATH without them (pyenv, a virtual environment) falls back to the system interpreter.
py=python3
if ! python3 -c 'import numpy, pytest' 2>/dev/null; then
  if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import numpy, pytest' 2>/dev/null; then
    py=/usr/bin/python3
  else
    echo "python-package: no python3 with numpy and pytest; install python3-numpy python3-pytest" >&2
    exit 1
  fi
fi
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" NVFP4MLA_LIBRARY=$lib
if ((sanitize)); then
  # The interpreter is not instrumented: its runtimes go first, and its own allocations are not leaks.
  export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" NVFP4MLA_CLI=none \
         ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
"$py" -m pytest -q python/tests
