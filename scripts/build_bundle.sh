#!/usr/bin/env bash
# Build the one-folder app bundle in dist/kvtrim with PyInstaller, then run its self-test.
#   bash scripts/build_bundle.sh        (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install --quiet "pyinstaller>=6.10"
.venv/bin/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
    packaging/kvtrim.spec
echo "bundle: dist/kvtrim, $(du -sh dist/kvtrim | cut -f1) ($(du -sh dist/kvtrim/_internal/models | cut -f1) of it the model)"
QT_QPA_PLATFORM=offscreen dist/kvtrim/kvtrim --self-test
