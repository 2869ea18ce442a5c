#!/usr/bin/env bash
# The test command's packaging step on its own: bash scripts/check-package.sh
#
# Builds the wheel and the sdist, checks their contents against the checkout, smoke-tests each
# in a fresh virtualenv and runs the example project on the installed wheel (see
# scripts/lib/package.sh). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh
# shellcheck source=scripts/lib/package.sh
source scripts/lib/package.sh

package_check
