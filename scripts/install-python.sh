#!/usr/bin/env bash
# Makes `import deep_ep` and `import proxyep` work for /usr/bin/python3 in any new shell: writes a
# .pth file naming the build's Python folder (build/<preset>/python, default release) into the
# interpreter's site-packages (the user's site-packages when not root). Run it once after the
# build; rebuilding needs no new run (the folder links the sources and holds the module).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${1:-release}
dir=$root/build/$preset/python
if ! compgen -G "$dir/proxyep/_proxyep*.so" >/dev/null; then
  echo "install-python: no Python module in $dir; build first: ./scripts/build.sh $preset" >&2
  exit 1
fi
site=$(/usr/bin/python3 -c 'import os, site
print(site.getsitepackages()[0] if os.geteuid() == 0 else site.getusersitepackages())')
mkdir -p "$site"
echo "$dir" >"$site/proxyep.pth"
/usr/bin/python3 -c 'import deep_ep, proxyep; print("install-python: deep_ep and proxyep import from", proxyep.__path__[0])'
