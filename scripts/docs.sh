#!/usr/bin/env bash
# Build the documentation site: bash scripts/docs.sh [OUTPUT_DIR]
#
# Sphinx with furo and MyST (docs/conf.py) in its own virtualenv, .venv/docs (the `docs`
# dependency group; reinstalled only when pyproject.toml changes), with warnings as errors and
# every reference checked (-n). The HTML goes to OUTPUT_DIR, by default docs/_build/html (git
# ignores it). scripts/test.sh runs this into a temporary directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh

out=${1:-docs/_build/html}
venv_ensure docs 3.11 -e . --group docs
# -E: read every page again, so a warning is never hidden by an earlier build's cache.
"$VENV_ROOT/docs/bin/python" -m sphinx -W --keep-going -n -E -q -b html docs "$out"
echo "docs: built in $out"
