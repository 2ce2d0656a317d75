#!/usr/bin/env bash
# Creates the virtual environment of the PyTorch that `lattice bench train` measures Lattice against:
# the newest torch 2.x from PyPI (what `pip install torch` gives a user today) and numpy, in
# ${LATTICE_PEER_VENV:-/opt/lattice/peer-venv}. For benchmarks only: the test suite keeps Debian's
# python3-torch (scripts/install_deps.sh). Does nothing when the venv already has a torch 2.x.
# Needs python3-venv and network access to PyPI; the wheels take about 5 GB (torch pulls in its CUDA
# libraries from PyPI even where only the CPU is used). Prints the venv's python at the end.
set -euo pipefail
venv="${LATTICE_PEER_VENV:-/opt/lattice/peer-venv}"
python="$venv/bin/python"
has_torch2() {
  "$python" -c 'import sys, torch; sys.exit(0 if torch.__version__.split(".")[0] == "2" else 1)' \
    2>/dev/null
}
if has_torch2; then
  echo "install_peers: $venv already has torch $("$python" -c 'import torch; print(torch.__version__)')"
else
  echo "install_peers: creating $venv with the newest torch 2.x and numpy from PyPI"
  mkdir -p "$(dirname "$venv")"
  [ -x "$python" ] || /usr/bin/python3 -m venv "$venv" || {
    echo "install_peers: error: '/usr/bin/python3 -m venv $venv' failed; install Debian's" \
      "python3-venv (scripts/install_deps.sh does) and check that $(dirname "$venv") is writable" >&2
    exit 1
  }
  "$python" -m pip install --quiet --disable-pip-version-check 'torch>=2,<3' numpy || {
    echo "install_peers: error: pip could not install torch 2.x into $venv; check the network" \
      "access to PyPI and the free disk space (about 5 GB), then run this script again" >&2
    exit 1
  }
  has_torch2 || {
    echo "install_peers: error: $python cannot import a torch 2.x after the install" >&2
    exit 1
  }
  echo "install_peers: installed torch $("$python" -c 'import torch; print(torch.__version__)')"
fi
echo "$python"
